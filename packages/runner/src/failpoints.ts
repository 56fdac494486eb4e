/**
 * Test-only crash injection (design §8). The environment variable
 * WEBCODEX_FAILPOINT is read exactly once, when this module is first loaded
 * at process start; nothing else (config, the Server, a frame) can set or
 * change it. Unset — the normal case — every `failpoint()` call is a no-op.
 * Set to one of FAILPOINTS, the Runner kills itself with SIGKILL the first
 * time it reaches that point: a real crash, no cleanup, no flush. The Server's
 * failpoints.ts is the same mechanism under its own variable and names; they
 * share no module because the one package both daemons depend on (protocol)
 * does no I/O.
 */
export const FAILPOINTS = [
  "after_admission",
  "before_barrier",
  "after_barrier_before_prompt",
  "after_prompt_write",
  "after_terminal_before_projection",
  // A run_as run's workspace (workspace/owned.ts): made and handed over, before and after its rename into place.
  "owned_before_rename",
  "owned_after_rename",
  // Its change (owned.ts): committed in the scratch repository, before and after the pack into the project.
  "owned_before_pack",
  "owned_after_pack",
  // Any workspace's change (workspace/workspaces.ts): the project's branch moved, then the head stored.
  "change_after_branch",
  "change_after_store",
] as const;
export type FailpointName = (typeof FAILPOINTS)[number];

export const FAILPOINT_ENV = "WEBCODEX_FAILPOINT";

function readOnce(): { active: FailpointName | null; invalid: string | null } {
  const raw = process.env[FAILPOINT_ENV];
  if (raw === undefined || raw === "") return { active: null, invalid: null };
  const match = FAILPOINTS.find((name) => name === raw);
  return match ? { active: match, invalid: null } : { active: null, invalid: raw.slice(0, 64) };
}

const STARTUP = Object.freeze(readOnce());

/** The failpoint armed for this process, or null. */
export function activeFailpoint(): FailpointName | null {
  return STARTUP.active;
}

/** A value of WEBCODEX_FAILPOINT that names no failpoint (ignored; the daemon logs it), or null. */
export function invalidFailpointValue(): string | null {
  return STARTUP.invalid;
}

/** Crash here (SIGKILL to this very process) if this failpoint is armed; otherwise do nothing. */
export function failpoint(name: FailpointName): void {
  if (STARTUP.active !== name) return;
  process.kill(process.pid, "SIGKILL");
}
