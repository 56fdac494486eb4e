/**
 * The one way tests wait for a condition that nothing pushes to them: call
 * `fn` every `intervalMs` until it returns a truthy value, and resolve with
 * that value. `fn` is always called at least once; when a falsy answer comes
 * back after `timeoutMs`, the promise rejects with an error naming `what` (or,
 * without it, the source text of `fn`) and the timeout. An error thrown by `fn`
 * (e.g. "the daemon exited") rejects at once.
 */

/** Time between two calls of the condition unless the caller says otherwise. */
export const POLL_INTERVAL_MS = 25;
/** Time between two looks at in-process state (an in-process Server, link or fake peer): cheap, so often. */
export const IN_PROCESS_POLL_MS = 10;
/** Time between two looks at a daemon's state over HTTP, its database or its log. */
export const DAEMON_POLL_MS = 50;
/** Bound on a condition decided inside the test process (an in-process Server, link or fake peer); sized for a machine three times slower than a quiet one (another suite beside it). */
export const IN_PROCESS_WAIT_MS = 15_000;
/** Bound on a condition that needs a daemon or agent child process to act (start-up, online, a prompt); sized for a loaded machine (a Server start took over 20 s at load 16 on 2 cores). */
export const DAEMON_WAIT_MS = 60_000;

export interface PollOptions {
  /** Give up after this long; always a named constant at the call site. */
  timeoutMs: number;
  /** Time between calls of the condition (default POLL_INTERVAL_MS). */
  intervalMs?: number;
  /** What is awaited, for the timeout error; a function is called only when the wait fails (e.g. to add a log). */
  what?: string | (() => string);
}

type Falsy = false | 0 | "" | null | undefined;

export async function poll<T>(fn: () => T | Promise<T>, options: PollOptions): Promise<Exclude<T, Falsy>> {
  const { timeoutMs, intervalMs = POLL_INTERVAL_MS, what } = options;
  // performance.now(): a test that fakes Date (vi.useFakeTimers({ toFake: ["Date"] })) still has a bound.
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const value = await fn();
    if (value) return value as Exclude<T, Falsy>;
    if (performance.now() > deadline) {
      const described = typeof what === "function" ? what() : (what ?? String(fn));
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${described}`);
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}
