/**
 * The MCP audit log (mcp/audit.ts) on the state engine of the pass (support/test-state.ts): SQLite in the
 * main pass, PostgreSQL in the PostgreSQL pass.
 */
import { pino } from "pino";
import { describe, expect, it, vi } from "vitest";
import { canary } from "../../../../scripts/vitest/canary.js";
import { AUDIT_FLUSH_MAX_ROWS, StateAuditLog } from "../../src/mcp/audit.js";
import { McpTools } from "../../src/mcp/tools.js";
import { ObserveLimits } from "../../src/runs/observe-limits.js";
import { RunTools, RUN_TOOL_NAMES as TOOL_NAMES } from "../../src/runs/tools.js";
import type { StateQueries } from "../../src/state/engine.js";
import { FakeRuns, principal } from "../support/fake-runs.js";
import { openTestState } from "../support/test-state.js";

/** Rows in the audit table, read through `db`. */
async function auditCount(db: StateQueries): Promise<number> {
  return (await db.get<{ n: number }>("SELECT COUNT(*) AS n FROM mcp_audit"))?.n ?? -1;
}

describe("state audit log", () => {
  it("keeps one durable row per tool call with lifecycle and sizes only", async () => {
    const state = await openTestState();
    const audit = new StateAuditLog(state.engine);
    const prompt = canary("prompt");
    const key = canary("idempotency-key");
    const message = canary("agent-message");
    const runs = new FakeRuns(message);
    const tools = new McpTools({
      runs,
      audit,
      logger: pino({ level: "silent" }),
      modules: [new RunTools({ runs, observeLimits: new ObserveLimits() })],
    });
    const alice = principal("alice", ["coding_agent:run", "project:write"]);
    const start = await tools.call(alice, TOOL_NAMES.start, {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: key,
      prompt: `please ${prompt}`,
    });
    const { run_id, observation_token } = start.structuredContent as { run_id: string; observation_token: string };
    await tools.call(alice, TOOL_NAMES.observe, { run_id, after_observation_token: observation_token });
    await tools.call(principal("bob", ["coding_agent:run"]), TOOL_NAMES.cancel, { run_id });

    const rows = await audit.list();
    expect(rows.map((r) => [r.principal_id, r.tool, r.run_id, r.outcome])).toEqual([
      ["alice", "start_coding_agent", run_id, "ok"],
      ["alice", "observe_coding_agent", run_id, "ok"],
      ["bob", "cancel_coding_agent", run_id, "not_found"],
    ]);
    expect(Object.keys(rows[0]!).sort()).toEqual(
      [
        "at",
        "attempt_id",
        "duration_ms",
        "id",
        "input_bytes",
        "outcome",
        "output_bytes",
        "principal_id",
        "run_id",
        "session_id",
        "task_id",
        "tool",
      ].sort(),
    );
    const text = await state.text();
    expect(text).toContain(run_id);
    for (const secret of [prompt, key, observation_token, message]) expect(text).not.toContain(secret);
  });

  it("batches rows off the per-call path and writes all N of N calls by close", async () => {
    const state = await openTestState();
    const audit = new StateAuditLog(state.engine);
    // The audit's writes: a transaction started by the end of the calls is a flush that did not wait for a timer.
    const writes = vi.spyOn(state.engine, "transaction");
    const runs = new FakeRuns();
    const tools = new McpTools({
      runs,
      audit,
      logger: pino({ level: "silent" }),
      modules: [new RunTools({ runs, observeLimits: new ObserveLimits() })],
    });
    const alice = principal("alice", ["coding_agent:run"]);
    await tools.call(alice, TOOL_NAMES.observe, { run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa" });
    expect(writes).not.toHaveBeenCalled(); // buffered, not one synchronous write per call
    expect(await auditCount(state.engine)).toBe(0);
    const n = AUDIT_FLUSH_MAX_ROWS + 7;
    for (let i = 1; i < n; i++) {
      await tools.call(alice, TOOL_NAMES.observe, { run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa" });
    }
    // A full batch is written at once: the writes started by now hold it.
    expect(writes).toHaveBeenCalled();
    await Promise.all(writes.mock.results.map((r) => r.value));
    expect(await auditCount(state.engine)).toBeGreaterThanOrEqual(AUDIT_FLUSH_MAX_ROWS);
    await audit.close();
    // Committed: another connection sees all n.
    expect(await auditCount(await state.another())).toBe(n);
  });

  it("keeps the table bounded: the newest maxRows rows survive, older ones are trimmed", async () => {
    const state = await openTestState();
    const row = (i: number) => ({
      principal_id: "alice",
      tool: TOOL_NAMES.observe,
      run_id: null,
      outcome: "ok" as const,
      input_bytes: i,
      output_bytes: 0,
      duration_ms: 0,
    });
    const audit = new StateAuditLog(state.engine, { maxRows: 50 });
    for (let i = 0; i < 1000; i++) audit.record(row(i));
    await audit.close();
    const kept = (await state.rows<{ input_bytes: number }>("SELECT input_bytes FROM mcp_audit ORDER BY id")).map(
      (r) => r.input_bytes,
    );
    expect(kept.length).toBeLessThanOrEqual(50 + AUDIT_FLUSH_MAX_ROWS);
    expect(kept.at(-1)).toBe(999);
    expect(kept).toEqual(Array.from({ length: kept.length }, (_, k) => 1000 - kept.length + k));
    // A restart with a smaller bound trims at its first write.
    const reopened = new StateAuditLog(state.engine, { maxRows: 10 });
    reopened.record(row(1000));
    await reopened.close();
    expect(await auditCount(state.engine)).toBe(10);
  });
});
