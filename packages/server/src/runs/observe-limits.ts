/**
 * Per-principal bound on observe calls that are waiting (wait_secs > 0) at
 * the same time. A principal over the bound gets `too_many_observers` at once
 * instead of another parked request; observes without a wait are not counted.
 */

/** Default number of concurrently waiting observes per principal. */
export const DEFAULT_MAX_WAITING_OBSERVES = 8;

export interface ObserveSlot {
  release(): void;
}

export class ObserveLimits {
  readonly limit: number;
  readonly #waiting = new Map<string, number>();

  constructor(limit: number = DEFAULT_MAX_WAITING_OBSERVES) {
    if (!Number.isInteger(limit) || limit < 1) throw new RangeError("observe limit must be an integer >= 1");
    this.limit = limit;
  }

  /** A slot for one waiting observe, or null when the principal is at its limit. */
  acquire(principalId: string): ObserveSlot | null {
    const current = this.#waiting.get(principalId) ?? 0;
    if (current >= this.limit) return null;
    this.#waiting.set(principalId, current + 1);
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        const now = (this.#waiting.get(principalId) ?? 1) - 1;
        if (now <= 0) this.#waiting.delete(principalId);
        else this.#waiting.set(principalId, now);
      },
    };
  }

  /** Waiting observes of one principal (for tests and status). */
  waiting(principalId: string): number {
    return this.#waiting.get(principalId) ?? 0;
  }
}
