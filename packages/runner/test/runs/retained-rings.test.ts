/**
 * The rings of retained terminal runs share one byte budget
 * (RETAINED_RINGS_MAX_BYTES): beyond it the oldest terminal runs leave memory
 * first, and sync answers them from the store with no events and
 * oldest_seq = last_seq + 1 — what the Server's mirror reads as lost history.
 */
import { afterAll, describe, expect, test } from "vitest";
import { RETAINED_RINGS_MAX_BYTES } from "../../src/runs/retention.js";
import { makeWorkspace, newManager, runToEnd, writeConfig } from "../support/harness.js";

const ws = makeWorkspace();
const config = writeConfig(ws);
/** A budget every ring exceeds: only the newest terminal run keeps its ring. */
const { manager: tight } = newManager(config, { retainedRingsMaxBytes: 1 });
const { manager: roomy } = newManager(config);
afterAll(async () => {
  await tight.close();
  await roomy.close();
  ws.cleanup();
});

const BURST = "scenario: burst count=200 chunk=16 kind=tool";

describe("retained ring budget", () => {
  test("is 64 MiB by default, across all retained terminal runs", () => {
    expect(RETAINED_RINGS_MAX_BYTES).toBe(64 * 1024 * 1024);
  });

  test("over budget: the oldest terminal run's ring goes first; its summary and last_seq stay answerable", async () => {
    const a = await runToEnd(tight, `${BURST}\ncase: a`);
    expect(a.run.last_seq).toBe(201);
    expect(tight.ring(a.run.run_id)?.bytes).toBeGreaterThan(1); // the newest run keeps its ring
    const b = await runToEnd(tight, `${BURST}\ncase: b`);
    expect(tight.ring(b.run.run_id)?.size).toBe(201);
    expect(tight.ring(a.run.run_id)).toBeUndefined();

    for (const after of [0, 100]) {
      const synced = tight.sync(a.run.run_id, after, 100);
      expect(synced?.events).toEqual([]);
      expect(synced?.has_more).toBe(false);
      expect(synced?.run).toMatchObject({
        run_id: a.run.run_id,
        phase: "terminal",
        state: "completed",
        last_seq: 201,
        oldest_seq: 202,
      });
    }
    expect(tight.inventory().find((r) => r.run_id === a.run.run_id)).toMatchObject({ state: "completed" });
  });

  test("within budget: recent terminal runs keep their rings", async () => {
    const a = await runToEnd(roomy, `${BURST}\ncase: roomy-a`);
    const b = await runToEnd(roomy, `${BURST}\ncase: roomy-b`);
    expect(roomy.ring(a.run.run_id)?.size).toBe(201);
    expect(roomy.ring(b.run.run_id)?.size).toBe(201);
    expect(roomy.sync(a.run.run_id, 0, 10)?.events).toHaveLength(10);
  });
});
