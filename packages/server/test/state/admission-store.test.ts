/**
 * The admission records store (state/store.ts) on both state engines: the Server's own SQLite file, and
 * a real PostgreSQL database (a throwaway cluster for this file, a fresh database per test) shared by two
 * StateStore instances, as two Server instances would share it. The same cases run against each: the
 * records API, compare-and-set, the state-change listeners inside the writer's transaction, the listing
 * queries, no stale read of a row another instance changed, and the same-key race — concurrent starts of
 * one run id, each deciding in `StateStore.decide` as admission does: exactly one inserts, the others
 * meet its record.
 *
 * SQLite allows one Server per state dir, so its "two instances" are one store (its engine serialises
 * the transactions); PostgreSQL's are two stores with their own connection pools.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { RunState, RunSummary } from "@webcodex/protocol";
import pino from "pino";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { poll } from "../../../../scripts/test-support/index.js";
import {
  POSTGRES_START_TIMEOUT_MS,
  type PostgresCluster,
  startPostgresCluster,
} from "../../../../scripts/test-support/postgres.js";
import type { Registry } from "../../src/link/registry.js";
import { MAX_ADMISSION_ROUNDS } from "../../src/runs/admission.js";
import { RunContext } from "../../src/runs/context.js";
import type { StateEngine } from "../../src/state/engine.js";
import { openPostgresEngine } from "../../src/state/engine-postgres.js";
import type { AdmissionRecord } from "../../src/state/record.js";
import { migrateState } from "../../src/state/schema.js";
import { RECORD_CHANGED, RECORD_CHANGES_CHANNEL, RECORD_PEEK_TTL_MS, StateStore } from "../../src/state/store.js";
import { runSummary } from "../support/run-summary.js";

/** Concurrent starts of one run id per race round, spread over the instances. */
const RACERS = 8;
/** Rounds of the same-key race per engine, each on a fresh run id. */
const RACE_ROUNDS = 10;
/** How long a racer holds its decision open before writing, so the others reach theirs meanwhile. */
const DECISION_HOLD_MS = 5;

let cluster: PostgresCluster | undefined;
const stores: StateStore[] = [];
const engines: StateEngine[] = [];
const dirs: string[] = [];

beforeAll(async () => {
  cluster = await startPostgresCluster();
}, POSTGRES_START_TIMEOUT_MS);

afterEach(async () => {
  vi.useRealTimers();
  for (const s of stores.splice(0)) await s.close();
  for (const e of engines.splice(0)) await e.close();
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

afterAll(async () => {
  await cluster?.close();
});

function stateDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "wc-admission-store-"));
  dirs.push(dir);
  return dir;
}

const ENGINES: readonly { name: string; instances(): Promise<[StateStore, StateStore]> }[] = [
  {
    name: "sqlite",
    async instances() {
      const store = new StateStore(stateDir());
      stores.push(store);
      return [store, store];
    },
  },
  {
    name: "postgres",
    async instances() {
      if (cluster === undefined) throw new Error("the PostgreSQL cluster did not start");
      const url = await cluster.createDatabase();
      const open = async (): Promise<StateStore> => {
        const engine = await openPostgresEngine({ url });
        engines.push(engine);
        await migrateState(engine, "test database");
        const store = new StateStore(stateDir(), { engine });
        stores.push(store);
        return store;
      };
      return [await open(), await open()];
    },
  },
];

function intent(runId: string, fingerprint = "f".repeat(64), runner = "r1") {
  return {
    run_id: runId,
    principal_id: "alice",
    project_id: "demo",
    provider_id: "fake",
    runner_id: runner,
    intent_fingerprint: fingerprint,
    agent_instance_id: "ai_1",
    provider_instance_id: "pi_1",
    store_id: "st_1",
    admission: "intent_recorded" as const,
    state: "starting" as const,
    execution_state: "not_started" as const,
    stop_reason: null,
    failure_kind: null,
    recovery_kind: "wait" as const,
    message: null,
  };
}

const runId = (n: number | string) => `wc_agent_run_${String(n).padStart(26, "a")}`;

/** Bound on a record change's notice reaching the other store (milliseconds on loopback when quiet). */
const NOTICE_WAIT_MS = 10_000;

/**
 * Listen now for the notice of `id`'s next change on `store`'s engine; the function it gives waits until the
 * engine delivered it, after `store`'s own listener (registered first, by `followChanges`) took it. SQLite
 * has no notices: there it waits for nothing.
 */
async function nextNotice(store: StateStore, id: string): Promise<{ told: () => Promise<void> }> {
  if (store.engine.dialect !== "postgres") return { told: async () => undefined };
  let heard: () => void = () => undefined;
  const notice = new Promise<void>((resolve) => {
    heard = resolve;
  });
  const stop = await store.engine.listen(RECORD_CHANGES_CHANNEL, (payload) => {
    if (payload === id || payload === null) heard();
  });
  return {
    told: async () => {
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`no change notice of ${id} within ${NOTICE_WAIT_MS} ms`)),
          NOTICE_WAIT_MS,
        );
      });
      try {
        await Promise.race([notice, late]);
      } finally {
        clearTimeout(timer);
        stop();
      }
    },
  };
}

/** Stop the wall clock the stores read (Date only; timers and I/O run): a copy `peek` keeps never runs out by itself. */
function freezeClock(): number {
  vi.useFakeTimers({ toFake: ["Date"] });
  return Date.now();
}

type StartOutcome = "inserted" | "replayed" | "conflict";

/**
 * One start of `id` as admission decides it (runs/admission.ts): read the record; none → insert it in
 * `StateStore.decide`, which holds only if the run id still has no record; an existing one → replay
 * (same fingerprint) or conflict. A decision that lost resolves again, at most MAX_ADMISSION_ROUNDS times.
 */
async function start(store: StateStore, id: string, fingerprint: string): Promise<StartOutcome> {
  for (let round = 0; round < MAX_ADMISSION_ROUNDS; round++) {
    const seen = await store.get(id);
    if (seen) return seen.intent_fingerprint === fingerprint ? "replayed" : "conflict";
    const outcome = await store.decide(
      id,
      seen,
      async (tx) => {
        await new Promise((resolve) => setTimeout(resolve, DECISION_HOLD_MS));
        const written = await store.insert(intent(id, fingerprint), tx);
        if (written === undefined) throw new Error("the insert met a record its decision did not see");
        return "inserted" as const;
      },
      { withoutFsync: true },
    );
    if (outcome !== RECORD_CHANGED) return outcome;
  }
  throw new Error(`no decision for ${id} in ${MAX_ADMISSION_ROUNDS} rounds`);
}

describe.each(ENGINES)("admission records on $name", ({ instances }) => {
  it("inserts, reads and patches a record (booleans and the effective config round-trip); a second insert of the id writes nothing", async () => {
    const [a] = await instances();
    const inserted = await a.insert(intent(runId(1)));
    expect(inserted).toMatchObject({ run_id: runId(1), cancel_forwarded: false, effective_config: [] });
    expect(await a.get(runId(1))).toEqual(inserted);
    expect(await a.insert(intent(runId(1), "0".repeat(64)))).toBeUndefined();
    expect((await a.get(runId(1)))?.intent_fingerprint).toBe("f".repeat(64));

    const effective: AdmissionRecord["effective_config"] = [{ id: "mode", value: "ask" }];
    const updated = await a.update(runId(1), {
      admission: "admitted",
      state: "running",
      cancel_forwarded: true,
      effective_config: effective,
    });
    expect(updated).toMatchObject({ admission: "admitted", state: "running", cancel_forwarded: true });
    expect(updated?.effective_config).toEqual(effective);
    expect(await a.get(runId(1))).toEqual(updated);
    expect(await a.update(runId(2), { state: "running" })).toBeUndefined();
    expect(await a.get(runId(2))).toBeUndefined();
  });

  it("writes a compare-and-set patch only while the record is still the one expected", async () => {
    const [a, b] = await instances();
    const first = await a.insert(intent(runId(1)));
    if (!first) throw new Error("not inserted");
    // Another instance changes the record: a patch expecting the first version writes nothing.
    await new Promise((resolve) => setTimeout(resolve, 2)); // a later updated_at
    const changed = await b.update(runId(1), { admission: "rejected_pre_admission", state: "failed" });
    expect(await a.update(runId(1), { admission: "sent" }, { expect: first })).toBeUndefined();
    expect(await a.get(runId(1))).toMatchObject({ admission: "rejected_pre_admission", state: "failed" });
    if (!changed) throw new Error("not changed");
    expect(await a.update(runId(1), { message: "again" }, { expect: changed })).toMatchObject({ message: "again" });
  });

  it("reads what another instance wrote, never a copy kept from before", async () => {
    const [a, b] = await instances();
    await a.insert(intent(runId(1)));
    expect((await a.get(runId(1)))?.state).toBe("starting");
    await b.update(runId(1), { state: "running" });
    expect((await a.get(runId(1)))?.state).toBe("running");
    await b.update(runId(1), { state: "completed" });
    expect((await a.get(runId(1)))?.state).toBe("completed");
  });

  it("tells state-change listeners inside the writer's transaction; a listener's throw rolls the change back", async () => {
    const [a] = await instances();
    await a.insert(intent(runId(1)));
    const seen: { previous: RunState; state: RunState; inTx: string | undefined }[] = [];
    let fail = false;
    a.onStateChange(async (rec, previous, tx) => {
      const row = await tx.get<{ state: string }>("SELECT state FROM admission_records WHERE run_id = ?", [rec.run_id]);
      seen.push({ previous, state: rec.state, inTx: row?.state });
      if (fail) throw new Error("listener refused");
    });
    await a.update(runId(1), { state: "running" });
    await a.update(runId(1), { message: "no state change" });
    expect(seen).toEqual([{ previous: "starting", state: "running", inTx: "running" }]);
    fail = true;
    await expect(a.update(runId(1), { state: "completed" })).rejects.toThrow(/listener refused/);
    expect((await a.get(runId(1)))?.state).toBe("running");
  });

  it("lists open records of a runner, records by admission, runs in use, recent records, and expires old rejections", async () => {
    const [a] = await instances();
    await a.insert(intent(runId(1), "f".repeat(64), "r1"));
    await a.insert(intent(runId(2), "f".repeat(64), "r1"));
    await a.insert(intent(runId(3), "f".repeat(64), "r2"));
    await a.update(runId(2), { admission: "admitted", state: "completed" });
    await a.update(runId(3), { admission: "rejected_pre_admission", state: "failed" });
    expect((await a.listOpenForRunner("r1")).map((r) => r.run_id)).toEqual([runId(1)]);
    expect((await a.listByAdmission("rejected_pre_admission")).map((r) => r.run_id)).toEqual([runId(3)]);
    expect(await a.countInUseByRunner()).toEqual(new Map([["r1", 1]]));
    expect((await a.listRecent({ state: "active" }, 10)).map((r) => r.run_id)).toEqual([runId(1)]);
    expect((await a.listRecent({ principal_id: "alice" }, 2)).length).toBe(2);
    expect(await a.listRecent({ project_id: "elsewhere" }, 10)).toEqual([]);
    expect(await a.deleteRejectedBefore(new Date(Date.now() - 60_000).toISOString(), 10)).toBe(0);
    expect(await a.deleteRejectedBefore(new Date(Date.now() + 60_000).toISOString(), 10)).toBe(1);
    expect(await a.get(runId(3))).toBeUndefined();
    expect(await a.get(runId(1))).toBeDefined();
  });

  it(`lets exactly one of ${RACERS} concurrent same-key starts insert the record, ${RACE_ROUNDS} rounds in a row; the others replay it`, async () => {
    const [a, b] = await instances();
    for (let round = 0; round < RACE_ROUNDS; round++) {
      const id = runId(`race${round}`);
      const outcomes = await Promise.all(
        Array.from({ length: RACERS }, (_, i) => start(i % 2 === 0 ? a : b, id, "f".repeat(64))),
      );
      expect(outcomes.filter((o) => o === "inserted")).toHaveLength(1);
      expect(outcomes.filter((o) => o === "replayed")).toHaveLength(RACERS - 1);
    }
  });

  it("answers a racing start with a different request for the same key with a conflict, never a second record", async () => {
    const [a, b] = await instances();
    const id = runId("conflict");
    const outcomes = await Promise.all([start(a, id, "1".repeat(64)), start(b, id, "2".repeat(64))]);
    expect([...outcomes].sort()).toEqual(["conflict", "inserted"]);
    const winner = outcomes[0] === "inserted" ? "1".repeat(64) : "2".repeat(64);
    expect((await a.get(id))?.intent_fingerprint).toBe(winner);
  });

  it("lets one of two concurrent re-sends of an unacknowledged record write; the other's decision is void", async () => {
    const [a, b] = await instances();
    const id = runId("resend");
    await a.insert(intent(id));
    const sent = await a.update(id, { admission: "sent" });
    await new Promise((resolve) => setTimeout(resolve, 2)); // the re-sends' writes get a later updated_at
    const resend = (store: StateStore) =>
      store.decide(id, sent, async (tx) => {
        await new Promise((resolve) => setTimeout(resolve, DECISION_HOLD_MS));
        return await store.update(id, { admission: "sent", cancel_forwarded: false }, { tx });
      });
    const outcomes = await Promise.all([resend(a), resend(b)]);
    expect(outcomes.filter((o) => o === RECORD_CHANGED)).toHaveLength(1);
    expect(outcomes.filter((o) => o !== RECORD_CHANGED && o?.admission === "sent")).toHaveLength(1);
  });
});

describe.each(ENGINES)("what observe shows (StateStore.peek) on $name", ({ instances }) => {
  it("shows another instance's write from the next peek after its notification", async () => {
    const [a, b] = await instances();
    await a.followChanges();
    // The copy's bound cannot run out: only the notice can make the write show.
    freezeClock();
    const id = runId("peek");
    // The insert's own notice comes first: a copy read before it would be dropped by it.
    const inserted = await nextNotice(a, id);
    await b.insert(intent(id));
    await inserted.told();
    expect((await a.peek(id))?.state).toBe("starting");
    expect((await a.peek(id))?.state).toBe("starting");
    const { told } = await nextNotice(a, id);
    await b.update(id, { state: "running", execution_state: "started" });
    await told();
    expect((await a.peek(id))?.state).toBe("running");
  });
});

describe("what observe shows (StateStore.peek) on PostgreSQL", () => {
  const postgres = ENGINES.find((e) => e.name === "postgres");
  it("shows a row changed behind the stores' backs within RECORD_PEEK_TTL_MS; `get` never answers from a copy", async () => {
    if (postgres === undefined) throw new Error("no PostgreSQL engine");
    const [a, b] = await postgres.instances();
    await a.followChanges();
    const readAt = freezeClock();
    const id = runId("untold");
    // The insert's own notice comes first: a copy read before it would be dropped by it.
    const inserted = await nextNotice(a, id);
    await b.insert(intent(id));
    await inserted.told();
    expect((await a.peek(id))?.state).toBe("starting");
    // A write that tells nobody (as if its notification were lost): shown at the latest after the bound.
    await b.engine.run("UPDATE admission_records SET state = 'completed' WHERE run_id = ?", [id]);
    expect((await a.get(id))?.state).toBe("completed");
    vi.setSystemTime(readAt + RECORD_PEEK_TTL_MS - 1);
    expect((await a.peek(id))?.state).toBe("starting");
    vi.setSystemTime(readAt + RECORD_PEEK_TTL_MS);
    expect((await a.peek(id))?.state).toBe("completed");
  });
});

/** A Runner's summary of `id` in `state` (what a run.update or a run.sync answer carries). */
function summaryOf(id: string, state: RunState, execution_state: "started" | "completed"): RunSummary {
  const done = state === "completed";
  return runSummary({
    run_id: id,
    state,
    execution_state,
    phase: done ? "terminal" : "dispatch_barrier",
    stop_reason: done ? "end_turn" : null,
  });
}

const context = (store: StateStore) => new RunContext(store, {} as Registry, pino({ level: "silent" }));

describe.each(ENGINES)("a Runner summary taken into the record (RunContext.persist) on $name", ({ instances }) => {
  it("checks a summary that changes nothing against a copy, reading nothing from the database", async () => {
    const [holder, other] = await instances();
    await holder.followChanges();
    // The copy's bound cannot run out: it is read again only after the write's notice.
    freezeClock();
    const id = runId("unchanged");
    await other.insert(intent(id));
    await other.update(id, { admission: "sent" });
    const ctx = context(holder);
    await ctx.persist(id, summaryOf(id, "running", "started"), "copy");
    expect(await holder.get(id)).toMatchObject({ admission: "admitted", state: "running" });
    const reads = vi.spyOn(holder.engine, "get");
    const transactions = vi.spyOn(holder.engine, "transaction");
    // Once the copy is read again after the write (and its notice), an unchanged summary is decided on it.
    await poll(
      async () => {
        reads.mockClear();
        await ctx.persist(id, summaryOf(id, "running", "started"), "copy");
        return reads.mock.calls.length === 0;
      },
      { timeoutMs: NOTICE_WAIT_MS, intervalMs: 5, what: "an unchanged summary decided on a copy" },
    );
    for (let i = 0; i < 5; i++) await ctx.persist(id, summaryOf(id, "running", "started"), "copy");
    expect(reads).not.toHaveBeenCalled();
    expect(transactions).not.toHaveBeenCalled();
    await ctx.persist(id, summaryOf(id, "completed", "completed"), "copy");
    expect(await other.get(id)).toMatchObject({ state: "completed", stop_reason: "end_turn" });
  });

  it("never moves a live run back to a summary that left the Runner before the one it took", async () => {
    const [holder] = await instances();
    const id = runId("stale");
    await holder.insert(intent(id));
    await holder.update(id, { admission: "sent" });
    const ctx = context(holder);
    const at = (ms: number) => new Date(Date.UTC(2026, 0, 1, 0, 0, 0, ms)).toISOString();
    const summary = (state: RunState, last_seq: number, ms: number): RunSummary =>
      runSummary({ run_id: id, state, execution_state: "started", last_seq, updated_at: at(ms) });
    const stateNow = async () => (await holder.get(id))?.state;
    await ctx.persist(id, summary("running", 1, 10));
    await ctx.persist(id, summary("waiting_permission", 2, 20));
    // A catch-up's answer from before the permission request, written after it.
    await ctx.persist(id, summary("running", 1, 10));
    expect(await stateNow()).toBe("waiting_permission");
    // The wait ends with the answer's event; then a cancel's answer sent while it was still waiting arrives.
    await ctx.persist(id, summary("running", 3, 30));
    await ctx.persist(id, summary("waiting_permission", 2, 20));
    await ctx.persist(id, summary("waiting_permission", 3, 25), "copy");
    expect(await stateNow()).toBe("running");
    // A state change without an event of its own is ordered by the Runner's stamp.
    await ctx.persist(id, summary("waiting_permission", 3, 40));
    expect(await stateNow()).toBe("waiting_permission");
    // The run's end is never stale.
    await ctx.persist(id, runSummary({ ...summaryOf(id, "completed", "completed"), last_seq: 1, updated_at: at(5) }));
    expect(await holder.get(id)).toMatchObject({ state: "completed", stop_reason: "end_turn" });
  });
});

describe("what observe shows (StateStore.peek) on PostgreSQL, read by many at once", () => {
  const postgres = ENGINES.find((e) => e.name === "postgres");
  it("shares one database read among the peeks of one record that start while it is read, unless a write was told", async () => {
    if (postgres === undefined) throw new Error("no PostgreSQL engine");
    const [a, b] = await postgres.instances();
    await a.followChanges();
    const readAt = freezeClock();
    const id = runId("herd");
    // The insert's own notice comes first: a copy read before it would be dropped by it.
    const inserted = await nextNotice(a, id);
    await b.insert(intent(id));
    await inserted.told();
    const reads = vi.spyOn(a.engine, "get");
    const many = await Promise.all(Array.from({ length: 20 }, () => a.peek(id)));
    expect(many.map((r) => r?.state)).toEqual(Array(20).fill("starting"));
    expect(reads).toHaveBeenCalledTimes(1);
    // A write told while a read is in flight: a peek after the notice does not join that read.
    reads.mockClear();
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const get = a.engine.get.bind(a.engine);
    reads.mockImplementationOnce(async (sql, params) => {
      await gate;
      return await get(sql, params);
    });
    // The copy runs out; the next peek reads, and that read is held.
    vi.setSystemTime(readAt + RECORD_PEEK_TTL_MS);
    const first = a.peek(id);
    const { told } = await nextNotice(a, id);
    await b.update(id, { state: "running", execution_state: "started" });
    await told();
    expect((await a.peek(id))?.state).toBe("running");
    expect(reads).toHaveBeenCalledTimes(2);
    release();
    expect((await first)?.state).toBe("running");
  });
});

describe("a Runner summary taken into the record (RunContext.persist) on PostgreSQL", () => {
  const postgres = ENGINES.find((e) => e.name === "postgres");
  it("writes a terminal summary the copy already shows when the database does not (restored from an older backup)", async () => {
    if (postgres === undefined) throw new Error("no PostgreSQL engine");
    const [holder, other] = await postgres.instances();
    await holder.followChanges();
    freezeClock();
    const id = runId("restored");
    await other.insert(intent(id));
    // Everything the Runner's terminal summary says, so that the copy alone would find nothing to write.
    await other.update(id, {
      admission: "admitted",
      state: "completed",
      execution_state: "completed",
      stop_reason: "end_turn",
      recovery_kind: "none",
    });
    const reads = vi.spyOn(holder.engine, "get");
    await poll(
      async () => {
        reads.mockClear();
        return (await holder.peek(id))?.state === "completed" && reads.mock.calls.length === 0;
      },
      { timeoutMs: NOTICE_WAIT_MS, intervalMs: 5, what: "a copy showing the end" },
    );
    // The row goes back without telling anyone, as a restore from a backup taken mid-run leaves it.
    await other.engine.run(
      "UPDATE admission_records SET state = 'running', execution_state = 'started' WHERE run_id = ?",
      [id],
    );
    expect((await holder.peek(id))?.state).toBe("completed");
    await context(holder).persist(id, summaryOf(id, "completed", "completed"), "copy");
    expect(await other.get(id)).toMatchObject({ state: "completed", execution_state: "completed" });
  });
});
