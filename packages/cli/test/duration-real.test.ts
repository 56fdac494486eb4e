/**
 * `webcodex run` and `webcodex observe` print the same duration for the same run, and it is the run's own:
 * from the Runner's admission to its terminal event (observe's `started_at` / `ended_at`), never the time the
 * client spent starting and following it. The real `webcodex` executable against a real Server child process,
 * a real Runner and the fake agent.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCli } from "../../../scripts/test/demo-stack.js";
import { okValue, ProcStack } from "../../server/test/support/proc-stack.js";

interface Summary {
  type: string;
  run_id: string;
  state: string;
  duration_ms: number | null;
}

function summaryOf(stdout: string): Summary {
  const line = stdout
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as Summary)
    .find((o) => o.type === "summary");
  if (line === undefined) throw new Error(`no summary line in:\n${stdout}`);
  return line;
}

let s: ProcStack;
let env: { url: string; token: string };

beforeAll(async () => {
  s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }], server: "child" }).init();
  await s.startRunner("r1");
  env = { url: `http://127.0.0.1:${s.port}/mcp`, token: s.principalTokens.get("alice") ?? "" };
}, 120_000);

afterAll(async () => {
  await s?.stop();
}, 60_000);

describe("a run's duration", () => {
  it("is the same in `run` and `observe`: the Runner's admission to its terminal event", async () => {
    const ran = await runCli(
      ["run", "--json", "--project", "demo", "--provider", "fake", "scenario: slow interval_ms=100 count=3"],
      env,
    );
    expect(ran.code, ran.stderr).toBe(0);
    const fromRun = summaryOf(ran.stdout);
    expect(fromRun.state).toBe("completed");

    const observed = await runCli(["observe", "--json", fromRun.run_id], env);
    expect(observed.code, observed.stderr).toBe(0);
    const fromObserve = summaryOf(observed.stdout);

    // What the Server says of the run: its start and end on the Runner's clock.
    const view = okValue(await s.observe("alice", { run_id: fromRun.run_id }));
    expect(view.started_at).toBeDefined();
    expect(view.ended_at).toBeDefined();
    const truth = Date.parse(view.ended_at ?? "") - Date.parse(view.started_at ?? "");
    expect(truth).toBeGreaterThan(0);
    expect(fromRun.duration_ms).toBe(truth);
    expect(fromObserve.duration_ms).toBe(truth);
  }, 120_000);
});
