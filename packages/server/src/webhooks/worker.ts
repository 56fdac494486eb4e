/**
 * The delivery worker, one per Server instance: every POLL_INTERVAL_MS (and soon after this instance wrote
 * an event) it claims due outbox rows (outbox.ts `claim`) for the room it has — at most MAX_IN_FLIGHT attempts
 * at once, MAX_IN_FLIGHT_PER_DESTINATION per receiver origin — makes each attempt (delivery.ts) and records
 * its outcome. A failed attempt is retried after `retryDelayMs` (exponential from the configured base, capped
 * at BACKOFF_MAX_MS, with jitter) until MAX_ATTEMPTS attempts or MAX_RETRY_WINDOW_MS since the event (or its
 * redelivery) are used up; then the row is a dead letter. A subscription whose attempts keep failing past both
 * bounds of its DisablePolicy (`[server.webhooks] disable_after_failures` and `disable_after_secs`) is disabled. Attempts run beside the run core, never in its path:
 * a slow receiver holds only its own slots.
 */
import type { Logger } from "pino";
import { ABORTED_ERROR, ATTEMPT_TIMEOUT_MS, type AttemptOutcome, attemptDelivery } from "./delivery.js";
import type { DestinationPolicy } from "./destination.js";
import type { ClaimedEvent, DisablePolicy, WebhookOutbox } from "./outbox.js";

/** How often the worker looks for due events when nothing woke it. */
export const POLL_INTERVAL_MS = 1000;
/** After this instance wrote an event: the worker looks this soon (the writing transaction commits first). */
export const WAKE_DELAY_MS = 20;
/** Attempts in flight on this instance at most. */
export const MAX_IN_FLIGHT = 16;
/** Attempts in flight to one receiver (scheme, host and port) on this instance at most. */
export const MAX_IN_FLIGHT_PER_DESTINATION = 4;
/** Attempts of one event at most before it is a dead letter. */
export const MAX_ATTEMPTS = 12;
/** Time since an event (or its redelivery) after which a failed attempt makes it a dead letter. */
export const MAX_RETRY_WINDOW_MS = 24 * 60 * 60 * 1000;
/** The first retry's delay by default (`[server.webhooks] retry_base_ms`). */
export const DEFAULT_RETRY_BASE_MS = 5000;
/** No retry waits longer than this. */
export const BACKOFF_MAX_MS = 60 * 60 * 1000;
/** A claim holds its row this long; past it (the instance died mid-attempt) another claim may take it. */
export const CLAIM_LEASE_MS = ATTEMPT_TIMEOUT_MS + 20_000;

/** The delay before attempt `attempts + 1`: base·2^(attempts−1), capped, then "equal jitter" (½ fixed, ½ random). */
export function retryDelayMs(attempts: number, baseMs: number, random: () => number = Math.random): number {
  const exp = Math.min(BACKOFF_MAX_MS, baseMs * 2 ** Math.max(0, attempts - 1));
  return Math.round(exp / 2 + random() * (exp / 2));
}

/** When a failed attempt's event is tried again, or null: a dead letter. */
export function nextAttemptAt(
  event: ClaimedEvent,
  nowMs: number,
  baseMs: number,
  random?: () => number,
): number | null {
  if (event.attempts >= MAX_ATTEMPTS) return null;
  const at = nowMs + retryDelayMs(event.attempts, baseMs, random);
  return at - event.retry_from_ms > MAX_RETRY_WINDOW_MS ? null : at;
}

export interface WorkerOptions {
  outbox: WebhookOutbox;
  policy: DestinationPolicy;
  retryBaseMs: number;
  /** When a subscription failing in a row is disabled. */
  disable: DisablePolicy;
  log: Logger;
  now?: () => number;
  /** Called with a claimed event before its attempt (test failpoints). */
  beforeAttempt?: (event: ClaimedEvent) => Promise<void> | void;
}

function destinationOf(url: string): string {
  try {
    return new URL(url).origin;
  } catch {
    return url;
  }
}

export class DeliveryWorker {
  readonly #opts: WorkerOptions;
  readonly #now: () => number;
  readonly #perDestination = new Map<string, number>();
  readonly #inFlight = new Set<Promise<void>>();
  #timer: NodeJS.Timeout | null = null;
  #ticking: Promise<void> | null = null;
  #again = false;
  #stopped = true;
  #abort = new AbortController();

  constructor(opts: WorkerOptions) {
    this.#opts = opts;
    this.#now = opts.now ?? Date.now;
  }

  start(): void {
    this.#stopped = false;
    this.#abort = new AbortController();
    this.#schedule(0);
  }

  /** Look for due events soon (this instance just wrote some). */
  wake(): void {
    if (!this.#stopped) this.#schedule(WAKE_DELAY_MS);
  }

  /**
   * Stop claiming and abort the attempts in flight; their claims stay, and are taken again when their leases
   * run out (on SQLite, at the next start).
   */
  async stop(): Promise<void> {
    this.#stopped = true;
    this.#abort.abort();
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    await this.#ticking;
    await Promise.all(this.#inFlight);
  }

  #schedule(delayMs: number): void {
    if (this.#stopped) return;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = setTimeout(() => this.#tick(), delayMs);
    this.#timer.unref();
  }

  #tick(): void {
    this.#timer = null;
    if (this.#ticking) {
      this.#again = true;
      return;
    }
    this.#ticking = this.#claimAndSend()
      .catch((err: unknown) => this.#opts.log.warn({ err: (err as Error).message }, "webhook claim failed"))
      .finally(() => {
        this.#ticking = null;
        const again = this.#again;
        this.#again = false;
        this.#schedule(again ? 0 : POLL_INTERVAL_MS);
      });
  }

  async #claimAndSend(): Promise<void> {
    const room = MAX_IN_FLIGHT - this.#inFlight.size;
    if (room <= 0 || this.#stopped) return;
    const now = this.#now();
    const taken = new Map<string, number>();
    const claimed = await this.#opts.outbox.claim(now, room, now + CLAIM_LEASE_MS, (row) => {
      const dest = destinationOf(row.url);
      const busy = (this.#perDestination.get(dest) ?? 0) + (taken.get(dest) ?? 0);
      if (busy >= MAX_IN_FLIGHT_PER_DESTINATION) return false;
      taken.set(dest, (taken.get(dest) ?? 0) + 1);
      return true;
    });
    for (const event of claimed) {
      const dest = destinationOf(event.url);
      this.#perDestination.set(dest, (this.#perDestination.get(dest) ?? 0) + 1);
      const attempt = this.#attempt(event).finally(() => {
        const left = (this.#perDestination.get(dest) ?? 1) - 1;
        if (left <= 0) this.#perDestination.delete(dest);
        else this.#perDestination.set(dest, left);
        this.#inFlight.delete(attempt);
        this.wake();
      });
      this.#inFlight.add(attempt);
    }
  }

  async #attempt(event: ClaimedEvent): Promise<void> {
    try {
      await this.#opts.beforeAttempt?.(event);
      const outcome: AttemptOutcome = await attemptDelivery({
        url: event.url,
        secrets: event.secrets,
        eventId: event.event_id,
        body: event.body,
        nowMs: this.#now(),
        policy: this.#opts.policy,
        signal: this.#abort.signal,
      });
      if (!outcome.ok && outcome.error === ABORTED_ERROR) return;
      const now = this.#now();
      const retryAt = outcome.ok ? null : nextAttemptAt(event, now, this.#opts.retryBaseMs);
      const { disabled } = await this.#opts.outbox.settle(event, outcome, now, retryAt, this.#opts.disable);
      if (disabled) {
        this.#opts.log.warn(
          { subscription_id: event.subscription_id },
          "webhook subscription disabled: its attempts kept failing (webhooks enable turns it back on)",
        );
      }
      if (!outcome.ok) {
        this.#opts.log.info(
          {
            subscription_id: event.subscription_id,
            event_id: event.event_id,
            attempts: event.attempts,
            status: outcome.status,
            error: outcome.error,
            dead: retryAt === null,
          },
          retryAt === null ? "webhook event is a dead letter" : "webhook attempt failed; retried later",
        );
      }
    } catch (err) {
      // The claim's lease runs out and the event is tried again.
      this.#opts.log.warn({ event_id: event.event_id, err: (err as Error).message }, "webhook attempt not recorded");
    }
  }
}
