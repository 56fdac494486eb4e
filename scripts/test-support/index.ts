/**
 * Shared test support, imported by relative path from every test folder
 * (packages/*\/test, fake-acp-agent/test, scripts/test, scripts/hardening/test):
 * repository and bin paths, polling, process lookup, the fake agent's ledger,
 * a port that refuses connections, and the daemon launchers. Package-specific
 * fixtures stay in each package's test/support folder and build on these.
 */
export { type DaemonOptions, DaemonProcess, type Exit, startRunnerProcess, startServerProcess } from "./daemons.js";
export { type LedgerLine, ledgerPrompts, readLedger } from "./ledger.js";
export { CLI_BIN, FAKE_AGENT_BIN, REPO_ROOT, RUNNER_BIN, SERVER_BIN } from "./paths.js";
export {
  DAEMON_POLL_MS,
  DAEMON_WAIT_MS,
  IN_PROCESS_POLL_MS,
  IN_PROCESS_WAIT_MS,
  POLL_INTERVAL_MS,
  type PollOptions,
  poll,
} from "./poll.js";
export { refusedPort } from "./ports.js";
export { alive, killProcesses, processesMentioning } from "./processes.js";
