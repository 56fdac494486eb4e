/** A 100k-update burst from the real fake agent stays within the ring's count and byte bounds. */
import { MAX_EVENTS_PER_UPDATE, RING_MAX_BYTES, RING_MAX_EVENTS } from "@webcodex/protocol";
import { afterAll, expect, test } from "vitest";
import { makeWorkspace, newManager, runToEnd, writeConfig } from "../support/harness.js";

const ws = makeWorkspace();
const { manager } = newManager(writeConfig(ws));
/** A small injected byte bound, so a burst of small events reaches it long before the count bound. */
const SMALL_RING_BYTES = 256 * 1024;
const { manager: small } = newManager(writeConfig(ws), { ringLimits: { maxBytes: SMALL_RING_BYTES } });
afterAll(async () => {
  await manager.close();
  await small.close();
  ws.cleanup();
});

/** Loose: a burst must not grow the process by more than this (the ring itself holds at most 8 MiB). */
const RSS_GROWTH_LIMIT = 512 * 1024 * 1024;

test("100k tool updates: ring bounded by count and bytes, seq monotonic, pushes batched", {
  timeout: 120_000,
}, async () => {
  let pushes = 0;
  let largestBatch = 0;
  let lastPushedSeq = 0;
  let monotonic = true;
  const rssBefore = process.memoryUsage().rss;
  let rssPeak = rssBefore;
  manager.onUpdate((_run, events) => {
    pushes++;
    if (pushes % 64 === 0) rssPeak = Math.max(rssPeak, process.memoryUsage().rss);
    largestBatch = Math.max(largestBatch, events.length);
    for (const e of events) {
      if (e.seq <= lastPushedSeq) monotonic = false;
      lastPushedSeq = e.seq;
    }
  });
  const { run } = await runToEnd(manager, "scenario: burst count=100000 chunk=16 kind=tool");
  rssPeak = Math.max(rssPeak, process.memoryUsage().rss);
  expect(run.state).toBe("completed");
  expect(run.last_seq).toBe(100_001);
  const ring = manager.ring(run.run_id);
  // The count bound is what stopped this ring (its events are small): it is full, and within bytes.
  expect(ring?.size).toBe(RING_MAX_EVENTS);
  expect(ring?.bytes).toBeLessThanOrEqual(RING_MAX_BYTES);
  expect(run.oldest_seq).toBe(run.last_seq - (ring?.size ?? 0) + 1);
  expect(monotonic).toBe(true);
  expect(largestBatch).toBeLessThanOrEqual(MAX_EVENTS_PER_UPDATE);
  expect(pushes).toBeGreaterThan(0);
  expect(rssPeak - rssBefore).toBeLessThan(RSS_GROWTH_LIMIT);
});

test("the byte bound evicts oldest events before the count bound is reached", { timeout: 120_000 }, async () => {
  const { run } = await runToEnd(small, "scenario: burst count=20000 chunk=16 kind=tool");
  expect(run.state).toBe("completed");
  expect(run.last_seq).toBe(20_001);
  const ring = small.ring(run.run_id);
  const size = ring?.size ?? 0;
  expect(ring?.bytes).toBeLessThanOrEqual(SMALL_RING_BYTES);
  // Full by bytes (within one small event of the bound), not by count.
  expect(ring?.bytes).toBeGreaterThan(SMALL_RING_BYTES - 1024);
  expect(size).toBeLessThan(RING_MAX_EVENTS);
  expect(size).toBeLessThan(20_001);
  expect(run.oldest_seq).toBe(run.last_seq - size + 1);
});
