/**
 * The one rule for packing a run's events into frames (the Runner's run.update
 * pushes and run.sync results, and a Server answering a forwarded run.sync from
 * its mirror): consecutive events, in order, at most `maxEvents`
 * of them and at most UPDATE_EVENT_BYTES of serialized events per batch —
 * half a frame, leaving the rest for the run summary and the envelope. A
 * batch always holds at least one event (an event is bounded far below
 * UPDATE_EVENT_BYTES by the protocol's text bounds), so packing always
 * progresses.
 */
import { MAX_EVENTS_PER_UPDATE, UPDATE_EVENT_BYTES } from "./bounds.js";
import type { RunEvent } from "./events.js";

/** Serialized size of one event in a JSON array (its text plus a separator). */
export function eventBytes(event: RunEvent): number {
  return Buffer.byteLength(JSON.stringify(event), "utf8") + 1;
}

export interface BatchOptions {
  /** Events per batch (default MAX_EVENTS_PER_UPDATE). */
  maxEvents?: number;
  /** Size of one event (default eventBytes); the ring passes its cached sizes. */
  sizeOf?: (event: RunEvent) => number;
}

/** Split `events` into frame-sized batches, in order. No events → one empty batch (a state-only frame). */
export function eventBatches(events: readonly RunEvent[], options: BatchOptions = {}): RunEvent[][] {
  const maxEvents = options.maxEvents ?? MAX_EVENTS_PER_UPDATE;
  const sizeOf = options.sizeOf ?? eventBytes;
  const batches: RunEvent[][] = [];
  let batch: RunEvent[] = [];
  let bytes = 0;
  for (const event of events) {
    const size = sizeOf(event);
    if (batch.length > 0 && (batch.length >= maxEvents || bytes + size > UPDATE_EVENT_BYTES)) {
      batches.push(batch);
      batch = [];
      bytes = 0;
    }
    batch.push(event);
    bytes += size;
  }
  batches.push(batch);
  return batches;
}
