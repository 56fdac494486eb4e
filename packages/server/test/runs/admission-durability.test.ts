/**
 * What is durable before `run.start` leaves (design §6.1: durably record the admission intent → send).
 * The intent commits without an fsync of its own; the `sent` commit that follows it is FULL (it fsyncs
 * the WAL, the intent included) and happens before the frame is written. The Runner's answer
 * (`admitted`) commits without one too: a `sent` record is re-sent with the same run_id. In-process Server (real
 * SQLite), the Runner's real link.ts over a real WebSocket, an in-memory RunService that looks at the
 * database through a second connection when run.start arrives.
 */
import Database from "better-sqlite3";
import { afterEach, describe, expect, it, vi } from "vitest";
import { IN_PROCESS_POLL_MS, IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import type { RunStartOutcome, RunStartRequest } from "../../../runner/src/runs/service.js";
import { STATE_DB_FILE } from "../../src/state/store.js";
import { FakeRunService } from "../support/fake-run-service.js";
import { alice, Harness } from "../support/in-process.js";

const R1 = { id: "r1", token: "token-one-aaaaaaaaaaaaaaaa", projects: ["demo"] };

/** Each write to admission_records, with the synchronous level in force when it ran (1 NORMAL, 2 FULL). */
interface Write {
  sql: string;
  level: unknown;
}

function recordAdmissionWrites(writes: (Write | "run.start arrived")[]): void {
  const probe = new Database(":memory:");
  type Method = (...a: unknown[]) => unknown;
  const proto = Object.getPrototypeOf(probe.prepare("SELECT 1")) as { run: Method; get: Method };
  probe.close();
  // A write runs as `run`, or as `get` when it returns the row it wrote (`UPDATE … RETURNING *`).
  for (const method of ["run", "get"] as const) {
    const original = proto[method];
    vi.spyOn(proto, method).mockImplementation(function (this: Database.Statement, ...args: unknown[]): unknown {
      if (/^\s*(INSERT INTO|UPDATE) admission_records/.test(this.source)) {
        writes.push({ sql: this.source.trim(), level: this.database.pragma("synchronous", { simple: true }) });
      }
      return original.apply(this, args);
    });
  }
}

describe("admission durability before run.start", () => {
  let h: Harness | undefined;
  afterEach(async () => {
    vi.restoreAllMocks();
    await h?.close();
    h = undefined;
  });

  it("commits the intent without an fsync, then `sent` with one, and only then sends run.start", async () => {
    h = await new Harness().start([R1]);
    const harness = h;
    const svc = new FakeRunService();
    const link = harness.link(svc, R1.token);
    await poll(() => link.connected, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    await poll(async () => (await harness.server.runs.listProjects(alice)).some((p) => p.runner_online), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });

    const writes: (Write | "run.start arrived")[] = [];
    let seenByOtherConnection: unknown;
    const start = svc.start.bind(svc);
    svc.start = async (req: RunStartRequest): Promise<RunStartOutcome> => {
      writes.push("run.start arrived");
      // Committed, not just written in this connection: another connection sees the record as `sent`.
      const other = new Database(`${harness.dir}/state/${STATE_DB_FILE}`, { readonly: true });
      seenByOtherConnection = other.prepare("SELECT admission FROM admission_records WHERE run_id = ?").get(req.run_id);
      other.close();
      return start(req);
    };
    recordAdmissionWrites(writes);

    const started = await harness.server.runs.start(alice, {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "durability-1",
      prompt: "scenario: hello",
    });
    expect(started.ok).toBe(true);

    const arrived = writes.indexOf("run.start arrived");
    const before = writes.slice(0, arrived) as Write[];
    expect(before.map((w) => [w.sql.split(/\s+/)[0], w.level])).toEqual([
      ["INSERT", 1], // the intent: NORMAL
      ["UPDATE", 2], // `sent`: FULL, before the frame
    ]);
    expect(before[1]?.sql).toMatch(/SET admission = \?, updated_at = \? WHERE/);
    expect(seenByOtherConnection).toEqual({ admission: "sent" });
    // The Runner's answer (`admitted`) commits without an fsync of its own: lost to an OS crash, the
    // record is `sent` again, which a replay re-sends and the Runner answers with the same run.
    const after = writes.slice(arrived + 1) as Write[];
    expect(after[0]?.sql).toMatch(/^UPDATE admission_records/);
    expect(after[0]?.level).toBe(1);
    // The connection is back at FULL for everything after (state changes).
    expect(harness.server.store.sqlite.pragma("synchronous", { simple: true })).toBe(2);
    expect((await harness.server.store.get(started.ok ? started.value.run_id : ""))?.admission).toBe("admitted");
  });
});
