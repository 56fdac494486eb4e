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
 * - `start_after_run_start`: the same point for start_coding_agent.
 * - `webhook_before_attempt`: a webhook event is claimed for delivery (committed), not sent yet.
 *
 * WEBCODEX_SERVER_FAILPOINT_ACTION (read once as well) chooses what happens there: `kill` (the default) or
 * `hold`: the start waits at that point, once, after writing FAILPOINT_HOLDING_LINE to stderr, until the
 * process receives SIGUSR2 — so a test can change the world at that exact point (stop the database) and
 * then let the start go on.
 */
export const SERVER_FAILPOINTS = [
  "start_after_intent",
  "task_after_binding",
  "task_after_run_start",
  "start_after_run_start",
  "webhook_before_attempt",
] as const;
export type ServerFailpointName = (typeof SERVER_FAILPOINTS)[number];

export const SERVER_FAILPOINT_ENV = "WEBCODEX_SERVER_FAILPOINT";
export const SERVER_FAILPOINT_ACTION_ENV = "WEBCODEX_SERVER_FAILPOINT_ACTION";
/** What a held failpoint writes to stderr (followed by its name) when it starts holding. */
export const FAILPOINT_HOLDING_LINE = "webcodex-server failpoint holding (SIGUSR2 releases):";

type Action = "kill" | "hold";

function readOnce(): { active: ServerFailpointName | null; invalid: string | null; action: Action } {
  const raw = process.env[SERVER_FAILPOINT_ENV];
  const action: Action = process.env[SERVER_FAILPOINT_ACTION_ENV] === "hold" ? "hold" : "kill";
  if (raw === undefined || raw === "") return { active: null, invalid: null, action };
  const match = SERVER_FAILPOINTS.find((name) => name === raw);
  return match ? { active: match, invalid: null, action } : { active: null, invalid: raw.slice(0, 64), action };
}

let held = false;

const STARTUP = Object.freeze(readOnce());

/** The failpoint armed for this process, or null. */
export function activeServerFailpoint(): ServerFailpointName | null {
  return STARTUP.active;
}

/** A value of WEBCODEX_SERVER_FAILPOINT that names no failpoint (ignored; logged at start), or null. */
export function invalidServerFailpointValue(): string | null {
  return STARTUP.invalid;
}

/**
 * Crash here (SIGKILL to this very process) if this failpoint is armed; with the `hold` action, the first
 * time only, a promise that resolves at SIGUSR2 (the caller awaits it). Otherwise do nothing.
 */
export function serverFailpoint(name: ServerFailpointName): Promise<void> | undefined {
  if (STARTUP.active !== name) return undefined;
  if (STARTUP.action === "kill") {
    process.kill(process.pid, "SIGKILL");
    return undefined;
  }
  if (held) return undefined;
  held = true;
  return new Promise<void>((resolve) => {
    process.once("SIGUSR2", () => resolve());
    process.stderr.write(`${FAILPOINT_HOLDING_LINE} ${name}\n`);
  });
}
