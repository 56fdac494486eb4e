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
 * - `key_lookup`: a key typed into the console login or the OAuth consent page is counted against its
 *   wrong-key limit, not looked up yet.
 *
 * WEBCODEX_SERVER_FAILPOINT_ACTION (read once as well) chooses what happens there: `kill` (the default),
 * `hold`: the first request to reach the point waits there, after writing FAILPOINT_HOLDING_LINE to stderr,
 * until the process receives SIGUSR2 — so a test can change the world at that exact point (stop the database)
 * and then let it go on — or `hold_all`: every request that reaches the point waits there (each writes the
 * line) until the first SIGUSR2 releases them all at once; later ones pass. So a test gathers concurrent
 * requests inside the window between a check and its effect, and sees how many got in (a race made certain).
 */
export const SERVER_FAILPOINTS = [
  "start_after_intent",
  "task_after_binding",
  "task_after_run_start",
  "start_after_run_start",
  "webhook_before_attempt",
  "key_lookup",
] as const;
export type ServerFailpointName = (typeof SERVER_FAILPOINTS)[number];

export const SERVER_FAILPOINT_ENV = "WEBCODEX_SERVER_FAILPOINT";
export const SERVER_FAILPOINT_ACTION_ENV = "WEBCODEX_SERVER_FAILPOINT_ACTION";
/** What a held failpoint writes to stderr (followed by its name) when it starts holding. */
export const FAILPOINT_HOLDING_LINE = "webcodex-server failpoint holding (SIGUSR2 releases):";

const ACTIONS = ["kill", "hold", "hold_all"] as const;
type Action = (typeof ACTIONS)[number];

function readOnce(): { active: ServerFailpointName | null; invalid: string | null; action: Action } {
  const raw = process.env[SERVER_FAILPOINT_ENV];
  const action: Action = ACTIONS.find((a) => a === process.env[SERVER_FAILPOINT_ACTION_ENV]) ?? "kill";
  if (raw === undefined || raw === "") return { active: null, invalid: null, action };
  const match = SERVER_FAILPOINTS.find((name) => name === raw);
  return match ? { active: match, invalid: null, action } : { active: null, invalid: raw.slice(0, 64), action };
}

let held = false;
/** With `hold_all`: the release every waiting request awaits, until SIGUSR2 (then null: later ones pass). */
let gate: Promise<void> | null | undefined;

const STARTUP = Object.freeze(readOnce());

/** The failpoint armed for this process, or null. */
export function activeServerFailpoint(): ServerFailpointName | null {
  return STARTUP.active;
}

/** What the armed failpoint does when reached: the start-up warning's words. */
export function serverFailpointEffect(): string {
  switch (STARTUP.action) {
    case "kill":
      return "this Server will SIGKILL itself there";
    case "hold":
      return "the first request to reach it waits there until SIGUSR2";
    case "hold_all":
      return "every request to reach it waits there until SIGUSR2";
  }
}

/** A value of WEBCODEX_SERVER_FAILPOINT that names no failpoint (ignored; logged at start), or null. */
export function invalidServerFailpointValue(): string | null {
  return STARTUP.invalid;
}

/**
 * Crash here (SIGKILL to this very process) if this failpoint is armed; with the `hold` action, the first
 * time only, a promise that resolves at SIGUSR2 (the caller awaits it); with `hold_all`, every time until the
 * first SIGUSR2, a promise that resolves then. Otherwise do nothing.
 */
export function serverFailpoint(name: ServerFailpointName): Promise<void> | undefined {
  if (STARTUP.active !== name) return undefined;
  if (STARTUP.action === "kill") {
    process.kill(process.pid, "SIGKILL");
    return undefined;
  }
  if (STARTUP.action === "hold_all") {
    if (gate === null) return undefined;
    gate ??= new Promise<void>((resolve) =>
      process.once("SIGUSR2", () => {
        gate = null;
        resolve();
      }),
    );
    process.stderr.write(`${FAILPOINT_HOLDING_LINE} ${name}\n`);
    return gate;
  }
  if (held) return undefined;
  held = true;
  return new Promise<void>((resolve) => {
    process.once("SIGUSR2", () => resolve());
    process.stderr.write(`${FAILPOINT_HOLDING_LINE} ${name}\n`);
  });
}
