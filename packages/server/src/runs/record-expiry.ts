/**
 * Records rejected before admission (`rejected_pre_admission`: the Runner
 * was offline, full, fenced out, or refused the run, so nothing ran) exist
 * so that an exact same-key retry re-admits the run and an observe can say
 * why it failed. They expire `[server] rejected_record_max_age_secs` after
 * their last change; after that the key is free again. Admitted, sent or
 * still-recorded runs never expire here.
 *
 * Swept at start and every REJECTED_SWEEP_INTERVAL_MS, at most
 * REJECTED_SWEEP_BATCH rows per statement, so a backlog never holds the
 * database for long.
 */
import type { Logger } from "pino";
import type { StateStore } from "../state/store.js";

// The default lives with the config key it is the default of.
export { DEFAULT_REJECTED_RECORD_MAX_AGE_SECS } from "../config-file.js";
export const REJECTED_SWEEP_INTERVAL_MS = 10 * 60 * 1000;
export const REJECTED_SWEEP_BATCH = 1000;
/** Most batches one sweep deletes before yielding to the next interval. */
export const REJECTED_SWEEP_MAX_BATCHES = 100;

/** Delete the rejected records older than `maxAgeSecs` at `now`; returns how many. */
export async function sweepRejectedRecords(store: StateStore, maxAgeSecs: number, now = Date.now()): Promise<number> {
  const cutoff = new Date(now - maxAgeSecs * 1000).toISOString();
  let total = 0;
  for (let i = 0; i < REJECTED_SWEEP_MAX_BATCHES; i++) {
    const n = await store.deleteRejectedBefore(cutoff, REJECTED_SWEEP_BATCH);
    total += n;
    if (n < REJECTED_SWEEP_BATCH) break;
  }
  return total;
}

/** Sweep now and then periodically until the returned stop() is called. */
export function startRejectedRecordExpiry(store: StateStore, maxAgeSecs: number, logger: Logger): () => void {
  // One sweep at a time: an interval that comes while one is still deleting is skipped.
  let running = false;
  const sweep = async () => {
    if (running) return;
    running = true;
    try {
      const n = await sweepRejectedRecords(store, maxAgeSecs);
      if (n > 0) logger.info({ count: n, max_age_secs: maxAgeSecs }, "expired records rejected before admission");
    } catch (err) {
      logger.error({ err: (err as Error).message }, "expiring rejected records failed");
    } finally {
      running = false;
    }
  };
  void sweep();
  const timer = setInterval(() => void sweep(), REJECTED_SWEEP_INTERVAL_MS);
  timer.unref();
  return () => clearInterval(timer);
}
