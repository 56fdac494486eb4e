/** Process lookup from /proc: scripts/processes.mjs (plain JavaScript, shared with the bench and the examples). */
export { alive, killProcesses, processesMentioning } from "../processes.mjs";
