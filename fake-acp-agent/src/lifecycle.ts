/**
 * Whether the agent process should outlive its connection. Normally the agent
 * exits when stdin closes; the `hang` scenario and `--hang-on` keep it alive
 * (ignoring stdin EOF) until it is killed, to exercise a client's kill path.
 */
export class Lifecycle {
  private holdTimer: NodeJS.Timeout | undefined;

  get heldOpen(): boolean {
    return this.holdTimer !== undefined;
  }

  /** Keeps the process alive past stdin EOF; logs `fake-acp-agent: holding open (<reason>)` to stderr. */
  holdOpen(reason: string): void {
    this.holdTimer ??= setInterval(() => {}, 1 << 30);
    console.error(`fake-acp-agent: holding open (${reason})`);
  }
}

/** A promise that never settles: "never answer this request". */
export function never<T>(): Promise<T> {
  return new Promise<T>(() => {});
}

/** Resolves when `signal` aborts (immediately if it already has). */
export function aborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
}

/** Sleeps `ms`; resolves `false` early if `signal` aborts, else `true`. */
export function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  if (signal?.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const onAbort = () => {
      clearTimeout(timer);
      resolve(false);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve(true);
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
