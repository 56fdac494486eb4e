/** The Runner logs one "run timings" line per dispatched run, in the shape scripts/bench/lib/runner-timings.mjs parses. */
import { Writable } from "node:stream";
import { pino } from "pino";
import { afterAll, expect, test } from "vitest";
import { makeWorkspace, newManager, runToEnd, writeConfig } from "../support/harness.js";

const STAGES = ["spawn", "initialize", "session_new", "config", "barrier_commit", "prompt_write"];

const lines: Record<string, unknown>[] = [];
const sink = new Writable({
  write(chunk, _encoding, done) {
    for (const line of String(chunk).split("\n")) if (line.startsWith("{")) lines.push(JSON.parse(line));
    done();
  },
});
const ws = makeWorkspace();
const config = writeConfig(ws, {
  agents: [{ id: "fake" }, { id: "fail-new", args: ["--ledger", ws.ledger, "--fail-session-new"] }],
});
const { manager } = newManager(config, { logger: pino({ level: "info" }, sink) });
afterAll(async () => {
  await manager.close();
  ws.cleanup();
});

test("one 'run timings' line per dispatched run, with the six stages as numbers (ms)", async () => {
  const t0 = performance.now();
  const { run } = await runToEnd(manager, "scenario: hello\ncase: timings");
  const elapsed = performance.now() - t0;
  expect(run.state).toBe("completed");
  const timings = lines.filter((l) => l.msg === "run timings");
  expect(timings).toHaveLength(1);
  const line = timings[0] as { run_id: unknown; timings_ms: Record<string, unknown> };
  expect(line.run_id).toBe(run.run_id);
  expect(Object.keys(line.timings_ms).sort()).toEqual([...STAGES].sort());
  for (const stage of STAGES) {
    const ms = line.timings_ms[stage];
    expect(typeof ms).toBe("number");
    expect(ms as number).toBeGreaterThanOrEqual(0);
    expect(Number.isFinite(ms)).toBe(true);
  }
  // They are this run's stages: starting a process takes time, and together they fit inside the run.
  expect(line.timings_ms.spawn as number).toBeGreaterThan(0);
  const total = STAGES.reduce((sum, stage) => sum + (line.timings_ms[stage] as number), 0);
  expect(total).toBeLessThanOrEqual(elapsed);
  // Numbers only: nothing else rides along (no paths, argv or env).
  expect(Object.keys(line).sort()).toEqual(["level", "msg", "pid", "hostname", "run_id", "time", "timings_ms"].sort());
});

test("no timings line for a run that never dispatched", async () => {
  const before = lines.filter((l) => l.msg === "run timings").length;
  const { run } = await runToEnd(manager, "scenario: hello\ncase: no-dispatch", { provider_id: "fail-new" });
  expect(run).toMatchObject({ state: "failed", execution_state: "not_started" });
  expect(lines.filter((l) => l.msg === "run timings").length).toBe(before);
});
