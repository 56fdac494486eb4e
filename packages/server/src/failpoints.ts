/**
 * Test-only crash injection for the Server (design §8), like the Runner's
 * failpoints.ts. WEBCODEX_SERVER_FAILPOINT is read exactly once, when this
 * module is first loaded; nothing else can set or change it. Unset — the
 * normal case — every `serverFailpoint()` call is a no-op. Set to one of
 * SERVER_FAILPOINTS, the Server kills itself with SIGKILL the first time it
 * reaches that point: a real crash, no cleanup, no flush.
 *
 * - `start_after_intent`: start_coding_agent's admission intent (and its
 *   workflow-session link with the `coding_agent_started` entry) is committed,
 *   `run.start` is not sent yet.
 * - `task_after_binding`: the Attempt→Run binding and the admission record are
 *   committed, `run.start` is not sent yet.
 * - `task_after_run_start`: the Runner answered `run.start`; the answer is not
 *   recorded yet.
 */
export const SERVER_FAILPOINTS = ["start_after_intent", "task_after_binding", "task_after_run_start"] as const;
export type ServerFailpointName = (typeof SERVER_FAILPOINTS)[number];

export const SERVER_FAILPOINT_ENV = "WEBCODEX_SERVER_FAILPOINT";

function readOnce(): { active: ServerFailpointName | null; invalid: string | null } {
  const raw = process.env[SERVER_FAILPOINT_ENV];
  if (raw === undefined || raw === "") return { active: null, invalid: null };
  const match = SERVER_FAILPOINTS.find((name) => name === raw);
  return match ? { active: match, invalid: null } : { active: null, invalid: raw.slice(0, 64) };
}

const STARTUP = Object.freeze(readOnce());

/** The failpoint armed for this process, or null. */
export function activeServerFailpoint(): ServerFailpointName | null {
  return STARTUP.active;
}

/** A value of WEBCODEX_SERVER_FAILPOINT that names no failpoint (ignored; logged at start), or null. */
export function invalidServerFailpointValue(): string | null {
  return STARTUP.invalid;
}

/** Crash here (SIGKILL to this very process) if this failpoint is armed; otherwise do nothing. */
export function serverFailpoint(name: ServerFailpointName): void {
  if (STARTUP.active !== name) return;
  process.kill(process.pid, "SIGKILL");
}
