import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { canary } from "../../../scripts/vitest/canary.js";
import { AUDIT_FLUSH_MAX_ROWS, StateAuditLog } from "../src/mcp/audit.js";
import { McpTools } from "../src/mcp/tools.js";
import { ObserveLimits } from "../src/runs/observe-limits.js";
import { RunTools, RUN_TOOL_NAMES as TOOL_NAMES } from "../src/runs/tools.js";
import { SqliteEngine } from "../src/state/engine-sqlite.js";
import { migrate } from "../src/state/schema.js";
import { FakeRuns, principal } from "./support/fake-runs.js";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** A fresh state database file in WAL mode, as the Server opens it; removed after the test. */
function openStateDb() {
  const dir = mkdtempSync(join(tmpdir(), "wc-audit-"));
  dirs.push(dir);
  const file = join(dir, "server.sqlite3");
  const db = new Database(file);
  db.pragma("journal_mode = WAL");
  migrate(db, file);
  return { dir, file, db };
}

describe("SQLite audit log", () => {
  it("keeps one durable row per tool call with lifecycle and sizes only", async () => {
    const { dir, db } = openStateDb();
    const audit = new StateAuditLog(new SqliteEngine(db));
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
    db.close();
    const bytes = readdirSync(dir)
      .map((f) => readFileSync(join(dir, f)).toString("latin1"))
      .join("");
    expect(bytes).toContain(run_id);
    for (const secret of [prompt, key, observation_token, message]) expect(bytes).not.toContain(secret);
  });

  it("batches rows off the per-call path and writes all N of N calls by close", async () => {
    const { file, db } = openStateDb();
    db.pragma("synchronous = FULL");
    const audit = new StateAuditLog(new SqliteEngine(db));
    const runs = new FakeRuns();
    const tools = new McpTools({
      runs,
      audit,
      logger: pino({ level: "silent" }),
      modules: [new RunTools({ runs, observeLimits: new ObserveLimits() })],
    });
    const alice = principal("alice", ["coding_agent:run"]);
    const count = () => (db.prepare("SELECT count(*) AS n FROM mcp_audit").get() as { n: number }).n;
    await tools.call(alice, TOOL_NAMES.observe, { run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa" });
    expect(count()).toBe(0); // buffered, not one synchronous write per call
    const n = AUDIT_FLUSH_MAX_ROWS + 7;
    for (let i = 1; i < n; i++) {
      await tools.call(alice, TOOL_NAMES.observe, { run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa" });
    }
    expect(count()).toBeGreaterThanOrEqual(AUDIT_FLUSH_MAX_ROWS); // a full batch is written at once
    await audit.close();
    db.close();
    const again = new Database(file, { readonly: true });
    expect((again.prepare("SELECT count(*) AS n FROM mcp_audit").get() as { n: number }).n).toBe(n);
    again.close();
  });

  it("keeps the table bounded: the newest maxRows rows survive, older ones are trimmed", async () => {
    const { db } = openStateDb();
    const row = (i: number) => ({
      principal_id: "alice",
      tool: TOOL_NAMES.observe,
      run_id: null,
      outcome: "ok" as const,
      input_bytes: i,
      output_bytes: 0,
      duration_ms: 0,
    });
    const audit = new StateAuditLog(new SqliteEngine(db), { maxRows: 50 });
    for (let i = 0; i < 1000; i++) audit.record(row(i));
    await audit.close();
    const kept = db.prepare("SELECT input_bytes FROM mcp_audit ORDER BY id").pluck().all() as number[];
    expect(kept.length).toBeLessThanOrEqual(50 + AUDIT_FLUSH_MAX_ROWS);
    expect(kept.at(-1)).toBe(999);
    expect(kept).toEqual(Array.from({ length: kept.length }, (_, k) => 1000 - kept.length + k));
    // A restart with a smaller bound trims at its first write.
    const reopened = new StateAuditLog(new SqliteEngine(db), { maxRows: 10 });
    reopened.record(row(1000));
    await reopened.close();
    expect(db.prepare("SELECT count(*) FROM mcp_audit").pluck().get()).toBe(10);
    db.close();
  });
});
