/**
 * Issue 12 §3: what leaves the Runner. A JSON-RPC error from the agent ends
 * the run with the fixed summary of its failure kind and the stage only; the
 * numeric code (and any agent text) stays in the Runner's local log.
 */
import { FAILURE_SUMMARIES } from "@webcodex/protocol";
import { pino } from "pino";
import { afterAll, describe, expect, test } from "vitest";
import { makeWorkspace, newManager, runToEnd, writeConfig } from "../support/harness.js";

const ws = makeWorkspace();
const lines: string[] = [];
const logger = pino({ level: "info" }, { write: (line: string) => lines.push(line) });
const { manager } = newManager(
  writeConfig(ws, {
    agents: [{ id: "fake" }, { id: "fail-new", args: ["--ledger", ws.ledger, "--fail-session-new"] }],
  }),
  { logger },
);
afterAll(async () => {
  await manager.close();
  ws.cleanup();
});

describe("terminal messages carry fixed summaries only", () => {
  test("a prompt answered with a JSON-RPC error: summary and stage on the run, the code only in the local log", async () => {
    const { run } = await runToEnd(manager, "scenario: prompt_error");
    expect(run).toMatchObject({ state: "failed", failure_kind: "prompt_error" });
    expect(run.message).toBe(`${FAILURE_SUMMARIES.prompt_error} Stage: prompt.`);
    const logged = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(logged.some((l) => l.run_id === run.run_id && l.rpc_code === -32603)).toBe(true);
  });

  test("a setup request rejected with a JSON-RPC error: summary and stage on the run, the code only in the local log", async () => {
    const { run } = await runToEnd(manager, "scenario: hello", { provider_id: "fail-new" });
    expect(run).toMatchObject({ state: "failed", execution_state: "not_started", failure_kind: "provider_rejected" });
    expect(run.message).toBe(`${FAILURE_SUMMARIES.provider_rejected} Stage: session_new. No prompt was dispatched.`);
    expect(run.message).not.toMatch(/-?\d{3,}/);
    const logged = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(logged.some((l) => l.run_id === run.run_id && typeof l.rpc_code === "number")).toBe(true);
  });
});
