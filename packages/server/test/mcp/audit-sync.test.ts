/**
 * Audit rows commit without an fsync of their own; the state database keeps its own level for admission.
 * The level is SQLite's `PRAGMA synchronous`, which PostgreSQL does not have (it commits audit rows durably
 * like everything else): those cases run on a SQLite file in either pass. That a relaxed flush commits is
 * checked on the pass's state engine (support/test-state.ts).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterEach, describe, expect, it } from "vitest";
import { StateAuditLog } from "../../src/mcp/audit.js";
import { SqliteEngine } from "../../src/state/engine-sqlite.js";
import { migrate } from "../../src/state/schema.js";
import { openTestState } from "../support/test-state.js";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function openWalDb(synchronous: "FULL" | "NORMAL") {
  const dir = mkdtempSync(join(tmpdir(), "wc-audit-sync-"));
  dirs.push(dir);
  const file = join(dir, "server.sqlite3");
  const db = new Database(file);
  db.pragma("journal_mode = WAL");
  db.pragma(`synchronous = ${synchronous}`);
  migrate(db, file); // the audit table is a schema step of the state database
  return { file, db };
}

const row = (i: number) => ({
  principal_id: "alice",
  tool: "observe_coding_agent",
  run_id: null,
  outcome: "ok" as const,
  input_bytes: i,
  output_bytes: 2,
  duration_ms: 1,
});

describe("audit flush durability level (SQLite's synchronous PRAGMA)", () => {
  it("writes a flush under synchronous=NORMAL and gives the connection back at FULL, rows committed", async () => {
    const { file, db } = openWalDb("FULL");
    const audit = new StateAuditLog(new SqliteEngine(db));
    const levels: number[] = [];
    // Record every synchronous level the audit sets on the connection.
    const pragma = db.pragma.bind(db);
    db.pragma = ((source: string, options?: { simple?: boolean }) => {
      const out = pragma(source, options);
      if (/^synchronous\s*=/.test(source)) levels.push(Number(source.split("=")[1]));
      return out;
    }) as typeof db.pragma;
    for (let i = 0; i < 3; i++) audit.record(row(i));
    await audit.flush();
    expect(levels).toEqual([1, 2]);
    expect(pragma("synchronous", { simple: true })).toBe(2);
    // Committed: another connection sees every row.
    const other = new Database(file, { readonly: true });
    expect((other.prepare("SELECT COUNT(*) AS n FROM mcp_audit").get() as { n: number }).n).toBe(3);
    other.close();
    db.close();
  });

  it("leaves a connection already at NORMAL as it is", async () => {
    const { db } = openWalDb("NORMAL");
    const audit = new StateAuditLog(new SqliteEngine(db));
    audit.record(row(1));
    await audit.flush();
    expect(db.pragma("synchronous", { simple: true })).toBe(1);
    expect(await audit.list()).toHaveLength(1);
    db.close();
  });
});

describe("a relaxed audit flush", () => {
  it("commits: another connection to the state sees every row", async () => {
    const state = await openTestState();
    const audit = new StateAuditLog(state.engine);
    for (let i = 0; i < 3; i++) audit.record(row(i));
    await audit.flush();
    const other = await state.another();
    expect(await other.all("SELECT input_bytes FROM mcp_audit ORDER BY id")).toEqual([
      { input_bytes: 0 },
      { input_bytes: 1 },
      { input_bytes: 2 },
    ]);
  });
});
