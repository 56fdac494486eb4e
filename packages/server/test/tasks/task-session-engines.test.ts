import { pino } from "pino";
import { describe, expect, it } from "vitest";
import type { Principal } from "../../src/principals/principal.js";
import type { AdmissionRequest, ApiResult, RunAdmission, StartOutput } from "../../src/runs/api.js";
import { SessionService } from "../../src/sessions/service.js";
import { MAX_EVIDENCE_PER_SESSION, SessionStore } from "../../src/sessions/store.js";
import type { StateEngine } from "../../src/state/engine.js";
import type { AdmissionRecord } from "../../src/state/record.js";
import type { StateStore } from "../../src/state/store.js";
import { TaskService } from "../../src/tasks/service.js";
import { TaskStore } from "../../src/tasks/store.js";
import { ENGINE_NAMES, engineFixture } from "../support/engines.js";

/** Server instances (engines on one database) per case. */
const INSTANCES = 3;
/** Rounds of each race. */
const ROUNDS = 12;
/** Concurrent claimants per round (spread over the instances). */
const CLAIMANTS = 6;
/** Evidence entries appended concurrently to one session: more than it keeps. */
const APPENDS = MAX_EVIDENCE_PER_SESSION + 44;
/**
 * Appends in flight at once. They all take the session's row lock in turn, so the whole burst at once would
 * queue past the pool's wait bound (POSTGRES_CONNECT_TIMEOUT_MS) on a loaded machine: a bound working as meant.
 */
const APPEND_WAVE = INSTANCES * 10;

const SECRET = Buffer.alloc(32, 7);
const quiet = pino({ level: "silent" });
const alice: Principal = {
  id: "alice",
  scopes: new Set(["coding_agent:run", "project:write", "runtime:read", "runtime:write"]),
  projects: new Set(["demo"]),
};

const fixture = engineFixture();

const ENGINES = ENGINE_NAMES.map(({ name }) => ({ name, open: (count: number) => fixture.instances(name, count) }));

/** The unported admission store's part these services read: the secret, and the given run records. */
function records(runs: readonly AdmissionRecord[] | ((runId: string) => AdmissionRecord | undefined) = []): StateStore {
  return {
    serverSecret: SECRET,
    get: typeof runs === "function" ? runs : (runId: string) => runs.find((r) => r.run_id === runId),
    onStateChange: () => undefined,
  } as unknown as StateStore;
}

/** Every run the admission path was asked for is recorded and still starting (nothing of it has ended). */
const startingRun = (runId: string): AdmissionRecord =>
  ({
    run_id: runId,
    provider_id: "fake",
    state: "starting",
    execution_state: "not_started",
    stop_reason: null,
    failure_kind: null,
    recovery_kind: "wait",
    message: null,
  }) as AdmissionRecord;

/** Admission as the run core does it for the managed path: the caller's `bind` in the intent transaction. */
function admissionOn(engine: StateEngine): RunAdmission {
  return {
    async admit(_principal, req: AdmissionRequest): Promise<ApiResult<StartOutput>> {
      const fences = {
        run_id: req.run_id,
        runner_id: "r1",
        agent_instance_id: "ai_1",
        provider_instance_id: "pi_1",
        store_id: "st_1",
      };
      const denied = await engine.transaction(async (tx) => (await req.bind?.(fences, tx)) ?? null);
      if (denied) return { ok: false, error: denied };
      return {
        ok: true,
        value: { run_id: req.run_id, replayed: false } as unknown as StartOutput,
      };
    },
  };
}

async function instances(open: (count: number) => Promise<StateEngine[]>) {
  return await open(INSTANCES);
}

function taskServices(engines: StateEngine[], now: () => number): TaskService[] {
  return engines.map(
    (engine) =>
      new TaskService({
        tasks: new TaskStore(engine),
        records: records(startingRun),
        admission: admissionOn(engine),
        logger: quiet,
        now,
      }),
  );
}

describe.each(ENGINES)("tasks and sessions on $name", ({ open }) => {
  it("of concurrent claimants of one task on several instances exactly one gets the attempt", async () => {
    const engines = await instances(open);
    let now = Date.parse("2026-03-01T00:00:00Z");
    const services = taskServices(engines, () => now);
    const created = await (services[0] as TaskService).createTask(alice, {
      project_id: "demo",
      instruction: "do the thing",
      idempotency_key: "race",
    });
    if (!created.ok) throw new Error(created.error.message);
    const taskId = created.value.task_id;
    for (let round = 1; round <= ROUNDS; round++) {
      const results = await Promise.all(
        Array.from({ length: CLAIMANTS }, (_, i) =>
          (services[i % INSTANCES] as TaskService).startAttempt(alice, {
            task_id: taskId,
            assignee: `host-${i}`,
            lease_secs: 60,
          }),
        ),
      );
      const won = results.filter((r) => r.ok);
      expect(won).toHaveLength(1);
      expect(won[0]?.ok && won[0].value.fence).toBe(round);
      for (const r of results) if (!r.ok) expect(r.error.code).toBe("claim_conflict");
      now += 61_000; // the lease expires: the next round is a fresh race
    }
    const attempts = await new TaskStore(engines[1] as StateEngine).attemptsOf(taskId);
    expect(attempts.map((a) => a.fence)).toEqual(Array.from({ length: ROUNDS }, (_, i) => i + 1));
    expect(attempts.filter((a) => a.state === "active")).toHaveLength(1);
  });

  it("creates one task for one key whichever instances the concurrent creates reach", async () => {
    const engines = await instances(open);
    const services = taskServices(engines, Date.now);
    for (let round = 0; round < ROUNDS; round++) {
      const results = await Promise.all(
        Array.from({ length: CLAIMANTS }, (_, i) =>
          (services[i % INSTANCES] as TaskService).createTask(alice, {
            project_id: "demo",
            instruction: "same",
            idempotency_key: `key-${round}`,
          }),
        ),
      );
      const values = results.map((r) => (r.ok ? r.value : null));
      expect(values.filter((v) => v?.replayed === false)).toHaveLength(1);
      expect(values.filter((v) => v?.replayed === true)).toHaveLength(CLAIMANTS - 1);
      expect(new Set(values.map((v) => v?.task_id)).size).toBe(1);
    }
    const n = await (engines[0] as StateEngine).get<{ n: number }>("SELECT COUNT(*) AS n FROM agent_tasks");
    expect(Number(n?.n)).toBe(ROUNDS);
  });

  it("checks the claim inside the admission transaction: of a start and a close racing, exactly one happens", async () => {
    const engines = await instances(open);
    const services = taskServices(engines, Date.now);
    const [a, b] = services as [TaskService, TaskService];
    let bound = 0;
    let refused = 0;
    for (let round = 0; round < ROUNDS; round++) {
      const created = await a.createTask(alice, {
        project_id: "demo",
        instruction: "x",
        idempotency_key: `c-${round}`,
      });
      if (!created.ok) throw new Error(created.error.message);
      const attempt = await a.startAttempt(alice, { task_id: created.value.task_id, assignee: "h", lease_secs: 60 });
      if (!attempt.ok) throw new Error(attempt.error.message);
      const [started, closed] = await Promise.all([
        a.startRun(alice, {
          project_id: "demo",
          provider_id: "fake",
          claim: { attempt_ref: attempt.value.attempt_ref },
        }),
        b.close(alice, { task_id: created.value.task_id, outcome: "abandoned" }),
      ]);
      // Either the run was bound first (and the close refused: its run has not ended), or the close won
      // (and the start refused as stale, nothing bound). Never a closed task with a run bound in flight.
      const binding = await new TaskStore(engines[2] as StateEngine).binding(attempt.value.attempt_id);
      if (started.ok) {
        bound += 1;
        expect(binding?.run_id).toBe(started.value.run_id);
        expect(closed.ok ? "closed" : closed.error.code).toBe("claim_conflict");
      } else {
        refused += 1;
        expect(started.error.code).toBe("stale_claim");
        expect(binding).toBeUndefined();
        expect(closed.ok).toBe(true);
      }
    }
    expect(bound + refused).toBe(ROUNDS);
  });

  it("appends concurrent evidence from several instances in order, bounded, with the drops counted", async () => {
    const engines = await instances(open);
    const stores = engines.map((engine) => new SessionStore(engine));
    const first = stores[0] as SessionStore;
    await first.insertSession({ session_id: "s1", principal_id: "alice", project_id: "demo", title: "t" });
    const append = (i: number) =>
      (stores[i % INSTANCES] as SessionStore).appendEvidence({
        session_id: "s1",
        kind: "coding_agent_started",
        run_id: `wc_agent_run_${i}`,
        provider_id: "fake",
        state: "starting",
        execution_state: "not_started",
        stop_reason: null,
        failure_kind: null,
      });
    for (let from = 0; from < APPENDS; from += APPEND_WAVE) {
      await Promise.all(Array.from({ length: Math.min(APPEND_WAVE, APPENDS - from) }, (_, k) => append(from + k)));
    }
    const kept = await first.evidenceAfter("s1", 0, APPENDS);
    expect(kept.map((e) => e.seq)).toEqual(
      Array.from({ length: MAX_EVIDENCE_PER_SESSION }, (_, i) => APPENDS - MAX_EVIDENCE_PER_SESSION + i + 1),
    );
    const session = await first.session("s1");
    expect(session?.evidence_last_seq).toBe(APPENDS);
    expect(session?.evidence_dropped).toBe(APPENDS - MAX_EVIDENCE_PER_SESSION);
    // Every append is there exactly once: the kept run ids are distinct.
    expect(new Set(kept.map((e) => e.run_id)).size).toBe(MAX_EVIDENCE_PER_SESSION);
  });

  it("of concurrent updates expecting one version exactly one wins", async () => {
    const engines = await instances(open);
    const services = engines.map((engine) => new SessionService(new SessionStore(engine), records(), quiet));
    const created = await (services[0] as SessionService).create(alice, { project_id: "demo", title: "t" });
    if (!created.ok) throw new Error(created.error.message);
    const sessionId = created.value.session_id;
    for (let round = 1; round <= ROUNDS; round++) {
      const results = await Promise.all(
        Array.from({ length: CLAIMANTS }, (_, i) =>
          (services[i % INSTANCES] as SessionService).update(alice, {
            session_id: sessionId,
            handoff: `round ${round} by ${i}`,
            expected_version: round,
          }),
        ),
      );
      const won = results.filter((r) => r.ok);
      expect(won).toHaveLength(1);
      expect(won[0]?.ok && won[0].value.version).toBe(round + 1);
      for (const r of results) if (!r.ok) expect(r.error.code).toBe("version_conflict");
    }
    const read = await (services[1] as SessionService).read(alice, { session_id: sessionId });
    expect(read.ok && read.value.handoff_version).toBe(ROUNDS);
  });

  it("writes a run's terminal entry once when every instance catches it up at the same time", async () => {
    const engines = await instances(open);
    const store = new SessionStore(engines[0] as StateEngine);
    await store.insertSession({ session_id: "s1", principal_id: "alice", project_id: "demo", title: "t" });
    const runs: AdmissionRecord[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      const runId = `wc_agent_run_term_${round}`;
      await store.linkRun(runId, "s1");
      runs.push({
        run_id: runId,
        provider_id: "fake",
        state: "completed",
        execution_state: "completed",
        stop_reason: "end_turn",
        failure_kind: null,
      } as AdmissionRecord);
    }
    const services = Array.from(
      { length: CLAIMANTS },
      (_, i) => new SessionService(new SessionStore(engines[i % INSTANCES] as StateEngine), records(runs), quiet),
    );
    await Promise.all(services.map((s) => s.start()));
    const entries = await store.evidenceAfter("s1", 0, 1000);
    expect(entries.map((e) => e.run_id).sort()).toEqual(runs.map((r) => r.run_id).sort());
    expect(entries.every((e) => e.kind === "coding_agent_terminal")).toBe(true);
    expect(await store.openRecordedRuns(1000)).toEqual([]);
  });

  it("quotes exactly the pinned version's texts, or refuses, when an update races the start", async () => {
    const engines = await instances(open);
    const [writer, reader] = engines.map(
      (engine) => new SessionService(new SessionStore(engine), records(), quiet),
    ) as [SessionService, SessionService];
    let quoted = 0;
    let conflicts = 0;
    for (let round = 0; round < ROUNDS; round++) {
      const created = await writer.create(alice, { project_id: "demo", title: `pin-${round}` });
      if (!created.ok) throw new Error(created.error.message);
      const id = created.value.session_id;
      const reviewed = `reviewed-handoff-${round}-7f3c9a1e5b`;
      const rewritten = `rewritten-handoff-${round}-c2d8e4f6a0`;
      await writer.update(alice, { session_id: id, handoff: reviewed });
      const [composed] = await Promise.all([
        reader.composeWithContext(alice, id, "demo", "the task", 2),
        writer.update(alice, { session_id: id, handoff: rewritten }),
      ]);
      if (composed.ok) {
        quoted += 1;
        expect(composed.value.prompt).toContain(reviewed);
        expect(composed.value.prompt).not.toContain(rewritten);
        expect(composed.value.snapshot.handoff_version).toBe(1);
      } else {
        conflicts += 1;
        expect(composed.error.code).toBe("context_version_conflict");
      }
    }
    expect(quoted + conflicts).toBe(ROUNDS);
  });
});
