/**
 * The Server's state DB: one Server process per state dir (two real
 * processes), forward schema migrations over `PRAGMA user_version` (a
 * database built with the schema as of commit 810c5de, before versioning),
 * and the expiry of records rejected before admission.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterEach, describe, expect, it } from "vitest";
import {
  DAEMON_WAIT_MS,
  IN_PROCESS_POLL_MS,
  IN_PROCESS_WAIT_MS,
  poll,
  SERVER_BIN,
} from "../../../../scripts/test-support/index.js";
import { buildServerConfig } from "../../src/config.js";
import { hashToken, TokenStore } from "../../src/principals/tokens.js";
import type { StartInput } from "../../src/runs/api.js";
import { deriveRunId } from "../../src/runs/identity.js";
import { DEFAULT_REJECTED_RECORD_MAX_AGE_SECS } from "../../src/runs/record-expiry.js";
import { type RunningServer, startServer } from "../../src/server.js";
import { MIGRATIONS, SCHEMA_VERSION, SchemaVersionError } from "../../src/state/schema.js";
import { STATE_DB_FILE, StateStore } from "../../src/state/store.js";
import { FakeRunService } from "../support/fake-run-service.js";
import { alice, captureLogger, Harness, makeConfig } from "../support/in-process.js";

const R1 = { id: "r1", token: "token-one-aaaaaaaaaaaaaaaa", projects: ["demo"] };

function input(key: string, extra: Partial<StartInput> = {}): StartInput {
  return { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt: "scenario: hello", ...extra };
}

/** The state DB's tables exactly as commit 810c5de created them (state/store.ts, principals/tokens.ts, mcp/audit.ts). */
const SCHEMA_810C5DE = `
  CREATE TABLE IF NOT EXISTS admission_records (
    run_id TEXT PRIMARY KEY,
    principal_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    provider_id TEXT NOT NULL,
    runner_id TEXT NOT NULL,
    intent_fingerprint TEXT NOT NULL,
    agent_instance_id TEXT,
    provider_instance_id TEXT,
    store_id TEXT,
    admission TEXT NOT NULL,
    state TEXT NOT NULL,
    execution_state TEXT NOT NULL,
    stop_reason TEXT,
    failure_kind TEXT,
    recovery_kind TEXT NOT NULL,
    message TEXT,
    cancel_forwarded INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
  ) STRICT;
  CREATE INDEX IF NOT EXISTS admission_records_runner ON admission_records (runner_id, state);
  CREATE TABLE IF NOT EXISTS principal_tokens (
    token_hash TEXT PRIMARY KEY,
    token_id TEXT NOT NULL UNIQUE,
    principal_id TEXT NOT NULL,
    scopes TEXT NOT NULL,
    projects TEXT NOT NULL,
    created_at TEXT NOT NULL,
    revoked_at TEXT
  );
  CREATE TABLE IF NOT EXISTS mcp_audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    principal_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    run_id TEXT,
    outcome TEXT NOT NULL,
    input_bytes INTEGER NOT NULL,
    output_bytes INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL
  );
  CREATE INDEX IF NOT EXISTS mcp_audit_principal_at ON mcp_audit (principal_id, at);
`;

const dirs: string[] = [];
function tempDir(): string {
  const d = mkdtempSync(join(tmpdir(), "wc-statedb-"));
  dirs.push(d);
  return d;
}

afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

describe("one Server per state dir", () => {
  const children: ChildProcess[] = [];
  afterEach(async () => {
    for (const c of children.splice(0)) {
      if (c.exitCode === null && c.signalCode === null) {
        c.kill("SIGKILL");
        await new Promise((r) => c.once("exit", r));
      }
    }
  });

  function spawnServer(config: string): { child: ChildProcess; out: string[]; err: string[] } {
    const child = spawn(process.execPath, [SERVER_BIN, "run", "--config", config], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, WEBCODEX_LOG_LEVEL: "warn" },
    });
    children.push(child);
    const out: string[] = [];
    const err: string[] = [];
    child.stdout?.on("data", (b: Buffer) => out.push(b.toString()));
    child.stderr?.on("data", (b: Buffer) => err.push(b.toString()));
    return { child, out, err };
  }

  const listening = (p: { out: string[] }) =>
    poll(() => p.out.join("").includes('"listening"'), { timeoutMs: DAEMON_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
  const exited = (c: ChildProcess) =>
    new Promise<number | null>((r) => {
      if (c.exitCode !== null) r(c.exitCode);
      else c.once("exit", (code) => r(code));
    });

  it("refuses a second Server process on the same state dir with a clear message, and frees it when the first is killed -9", async () => {
    const dir = tempDir();
    const config = join(dir, "server.toml");
    writeFileSync(config, '[server]\nhost = "127.0.0.1"\nport = 0\nstate_dir = "state"\n');
    const first = spawnServer(config);
    await listening(first);

    const second = spawnServer(config);
    expect(await exited(second.child)).toBe(1);
    const message = second.err.join("");
    expect(message).toContain(`state dir ${join(dir, "state")} is in use by another webcodex-server`);
    expect(message).toContain("give this one its own [server] state_dir");
    expect(second.out.join("")).not.toContain("listening");

    // The first one is unaffected, and a crash (no cleanup at all) leaves no stale lock behind.
    expect(first.child.exitCode).toBeNull();
    first.child.kill("SIGKILL");
    await exited(first.child);
    const third = spawnServer(config);
    await listening(third);
    third.child.kill("SIGTERM");
    expect(await exited(third.child)).toBe(0);
  });

  it("gives the state dir back on close, so the same process can start a Server on it again", async () => {
    const dir = tempDir();
    const log = captureLogger();
    const config = makeConfig(dir, []);
    const a = await startServer({ config, logger: log.logger });
    await expect(startServer({ config, logger: log.logger })).rejects.toThrow(/is in use by another webcodex-server/);
    await a.close();
    const b = await startServer({ config, logger: log.logger });
    await b.close();
  });
});

describe("state DB schema versions", () => {
  it("opens a database made by the schema before versioning (810c5de): records and tokens survive, user_version is current", async () => {
    const dir = tempDir();
    const stateDir = join(dir, "state");
    // The previous schema, with a record and an issued token in it, as a pre-versioning Server left it.
    const first = new StateStore(stateDir); // only for the secret file; its DB is thrown away below
    const secret = first.serverSecret;
    await first.close();
    rmSync(join(stateDir, STATE_DB_FILE));
    const old = new Database(join(stateDir, STATE_DB_FILE));
    old.pragma("journal_mode = WAL");
    old.exec(SCHEMA_810C5DE);
    const runId = deriveRunId(secret, "alice", "before-versioning");
    old
      .prepare(
        `INSERT INTO admission_records (run_id, principal_id, project_id, provider_id, runner_id, intent_fingerprint,
           agent_instance_id, provider_instance_id, store_id, admission, state, execution_state, stop_reason,
           failure_kind, recovery_kind, message, cancel_forwarded, created_at, updated_at)
         VALUES (?, 'alice', 'demo', 'fake', 'r1', 'fp', 'ai', 'pi', 'st', 'admitted', 'completed', 'finished',
           'end_turn', NULL, 'none', NULL, 0, '2026-01-01T00:00:00.000Z', '2026-01-01T00:01:00.000Z')`,
      )
      .run(runId);
    // A token row as the pre-versioning TokenStore wrote it.
    const token = `wct_${"t".repeat(43)}`;
    old
      .prepare(
        "INSERT INTO principal_tokens (token_hash, token_id, principal_id, scopes, projects, created_at) VALUES (?, ?, ?, ?, ?, ?)",
      )
      .run(hashToken(token), "tok_old", "alice", '["project:read"]', '["demo"]', "2026-01-01T00:00:00.000Z");
    expect(old.pragma("user_version", { simple: true })).toBe(0);
    old.close();

    const store = new StateStore(stateDir);
    try {
      expect(store.migrated).toEqual(MIGRATIONS.map((m) => m.version));
      expect(store.sqlite.pragma("user_version", { simple: true })).toBe(SCHEMA_VERSION);
      expect(await store.get(runId)).toMatchObject({
        principal_id: "alice",
        admission: "admitted",
        state: "completed",
        stop_reason: "end_turn",
        cancel_forwarded: false,
      });
      const indexes = store.sqlite
        .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'admission_records'")
        .all() as { name: string }[];
      expect(indexes.map((i) => i.name)).toContain("admission_records_admission_age");
      const principal = await new TokenStore(store.engine).verify(token, () => ({
        id: "alice",
        scopes: ["project:read"],
        projects: ["demo"],
      }));
      expect(principal?.id).toBe("alice");
    } finally {
      await store.close();
    }
    // Opening again changes nothing.
    const again = new StateStore(stateDir);
    expect(again.migrated).toEqual([]);
    expect((await again.get(runId))?.state).toBe("completed");
    await again.close();
  });

  it("refuses a database from a newer schema, naming both versions, and leaves it untouched", async () => {
    const stateDir = join(tempDir(), "state");
    await new StateStore(stateDir).close();
    const db = new Database(join(stateDir, STATE_DB_FILE));
    db.pragma(`user_version = ${SCHEMA_VERSION + 1}`);
    db.close();
    let error: unknown;
    try {
      await new StateStore(stateDir).close();
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(SchemaVersionError);
    expect((error as Error).message).toContain(`schema version ${SCHEMA_VERSION + 1} is newer`);
    expect((error as Error).message).toContain(`(${SCHEMA_VERSION})`);
    const after = new Database(join(stateDir, STATE_DB_FILE));
    expect(after.pragma("user_version", { simple: true })).toBe(SCHEMA_VERSION + 1);
    after.close();
  });
});

describe("expiry of records rejected before admission", () => {
  let h: Harness | undefined;
  afterEach(async () => {
    await h?.close();
    h = undefined;
  });

  it("defaults rejected_record_max_age_secs to seven days and refuses ages below a minute, naming the key", () => {
    expect(makeConfig(tempDir(), []).rejectedRecordMaxAgeSecs).toBe(DEFAULT_REJECTED_RECORD_MAX_AGE_SECS);
    expect(DEFAULT_REJECTED_RECORD_MAX_AGE_SECS).toBe(7 * 24 * 3600);
    const build = (age: number) =>
      buildServerConfig({ server: { rejected_record_max_age_secs: age } }, { file: "s.toml", baseDir: tempDir() });
    expect(build(3600).rejectedRecordMaxAgeSecs).toBe(3600);
    expect(() => build(59)).toThrow(/s\.toml: server\.rejected_record_max_age_secs: .*60/);
    expect(() => build(1.5)).toThrow(/server\.rejected_record_max_age_secs/);
  });

  it("deletes only rejected records older than rejected_record_max_age_secs at start, which frees their key", async () => {
    h = await new Harness().start([R1]);
    const server = (): RunningServer => (h as Harness).server;
    // Rejected before admission: the Runner is offline.
    for (const key of ["old-rejected", "new-rejected"]) {
      expect(await server().runs.start(alice, input(key))).toMatchObject({
        ok: false,
        error: { code: "runner_unavailable" },
      });
    }
    // Admitted and finished: never expires here, however old.
    const svc = new FakeRunService();
    h.link(svc, R1.token);
    await poll(async () => (await server().runs.listProjects(alice)).some((p) => p.runner_online), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    const admitted = await server().runs.start(alice, input("old-admitted"));
    if (!admitted.ok) throw new Error("expected an admitted run");
    svc.finish(admitted.value.run_id);
    await poll(async () => (await server().store.get(admitted.value.run_id))?.state === "completed", {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });

    const secret = server().store.serverSecret;
    const id = (key: string) => deriveRunId(secret, alice.id, key);
    const port = server().port;
    await Promise.all(h.links.splice(0).map((l) => l.close()));
    await server().close();

    // Age two records past an hour, in the file itself.
    const maxAge = 3600;
    const db = new Database(join(h.config.stateDir, STATE_DB_FILE));
    const twoHoursAgo = new Date(Date.now() - 2 * maxAge * 1000).toISOString();
    const age = db.prepare("UPDATE admission_records SET updated_at = ? WHERE run_id = ?");
    age.run(twoHoursAgo, id("old-rejected"));
    age.run(twoHoursAgo, id("old-admitted"));
    db.close();

    h.config = { ...h.config, port, rejectedRecordMaxAgeSecs: maxAge };
    h.server = await startServer({ config: h.config, logger: h.log.logger });
    expect(await server().store.get(id("old-rejected"))).toBeUndefined();
    expect(await server().store.get(id("new-rejected"))).toMatchObject({ admission: "rejected_pre_admission" });
    expect(await server().store.get(id("old-admitted"))).toMatchObject({ state: "completed" });
    expect(h.log.lines.some((l) => l.includes("expired records rejected before admission"))).toBe(true);

    // The expired key is free for another request; the kept ones still conflict.
    const reused = await server().runs.start(alice, input("old-rejected", { prompt: "something else" }));
    expect(reused).toMatchObject({ ok: false, error: { code: "runner_unavailable" } });
    const conflict = await server().runs.start(alice, input("new-rejected", { prompt: "something else" }));
    expect(conflict).toMatchObject({ ok: false, error: { code: "idempotency_conflict" } });
  });
});
