/** A 100k-update burst from the real fake agent stays within the ring's count and byte bounds. */
import { MAX_EVENTS_PER_UPDATE, RING_MAX_BYTES, RING_MAX_EVENTS } from "@webcodex/protocol";
import { afterAll, expect, test } from "vitest";
import { makeWorkspace, newManager, runToEnd, writeConfig } from "./support/harness.js";

const ws = makeWorkspace();
const { manager } = newManager(writeConfig(ws));
afterAll(async () => {
  await manager.close();
  ws.cleanup();
});

test("100k tool updates: ring bounded by count and bytes, seq monotonic, pushes batched", {
  timeout: 120_000,
}, async () => {
  let pushes = 0;
  let largestBatch = 0;
  let lastPushedSeq = 0;
  let monotonic = true;
  manager.onUpdate((_run, events) => {
    pushes++;
    largestBatch = Math.max(largestBatch, events.length);
    for (const e of events) {
      if (e.seq <= lastPushedSeq) monotonic = false;
      lastPushedSeq = e.seq;
    }
  });
  const { run } = await runToEnd(manager, "scenario: burst count=100000 chunk=16 kind=tool");
  expect(run.state).toBe("completed");
  expect(run.last_seq).toBe(100_001);
  const ring = manager.ring(run.run_id);
  expect(ring?.size).toBeLessThanOrEqual(RING_MAX_EVENTS);
  expect(ring?.bytes).toBeLessThanOrEqual(RING_MAX_BYTES);
  expect(run.oldest_seq).toBe(run.last_seq - (ring?.size ?? 0) + 1);
  expect(monotonic).toBe(true);
  expect(largestBatch).toBeLessThanOrEqual(MAX_EVENTS_PER_UPDATE);
  expect(pushes).toBeGreaterThan(0);
});
