/**
 * Attempt refs, managed-path identity, and task retention over a TaskStore on the pass's state engine
 * (support/test-state.ts): SQLite in the main pass, PostgreSQL in the PostgreSQL pass.
 */
import { randomBytes } from "node:crypto";
import { describe, expect, it } from "vitest";
import { deriveRunId } from "../../src/runs/identity.js";
import type { StateEngine } from "../../src/state/engine.js";
import { AttemptRefs, deriveTaskId, deriveTaskRunId } from "../../src/tasks/claim.js";
import { TaskStore } from "../../src/tasks/store.js";
import { openTestState } from "../support/test-state.js";

const claim = {
  task_id: "wc_task_aaaaaaaaaaaaaaaaaaaaaaaaaa",
  attempt_id: "wc_attempt_bbbbbbbbbbbbbbbbbbbbbbbbbb",
  assignee: "host ünïcode",
  fence: 3,
  controller_generation: 2,
};

describe("attempt_ref", () => {
  it("reads back exactly the claim it was issued for", () => {
    const refs = new AttemptRefs(randomBytes(32));
    expect(refs.read(refs.issue(claim))).toEqual(claim);
  });

  it("refuses every single-character change, a truncation and a ref from another Server secret", () => {
    const refs = new AttemptRefs(randomBytes(32));
    const ref = refs.issue(claim);
    for (let i = "wcatt1.".length; i < ref.length; i++) {
      const c = ref[i] === "A" ? "B" : "A";
      const changed = ref.slice(0, i) + c + ref.slice(i + 1);
      if (changed !== ref && changed[i] !== ".") expect(refs.read(changed), `position ${i}`).toBeNull();
    }
    expect(refs.read(ref.slice(0, -1))).toBeNull();
    expect(new AttemptRefs(randomBytes(32)).read(ref)).toBeNull();
    expect(refs.read("wcatt1.")).toBeNull();
    expect(refs.read(`${ref}.x`)).toBeNull();
  });
});

describe("managed-path identity", () => {
  it("derives task ids per principal and task run ids in their own domain, never a start_coding_agent run id", () => {
    const secret = randomBytes(32);
    expect(deriveTaskId(secret, "alice", "k")).toBe(deriveTaskId(secret, "alice", "k"));
    expect(deriveTaskId(secret, "alice", "k")).not.toBe(deriveTaskId(secret, "bob", "k"));
    const runId = deriveTaskRunId(secret, "alice", claim.task_id, claim.attempt_id);
    expect(runId).toMatch(/^wc_agent_run_[a-z2-7]{26}$/);
    expect(runId).not.toBe(deriveTaskRunId(secret, "alice", claim.task_id, "wc_attempt_cccccccccccccccccccccccccc"));
    expect(runId).not.toBe(deriveRunId(secret, "alice", `${claim.task_id}${claim.attempt_id}`));
  });
});

/** A migrated state engine of the test's own. */
async function migrated(): Promise<StateEngine> {
  return (await openTestState()).engine;
}

describe("task retention", () => {
  it("deletes closed tasks past retention with their attempts and bindings, and keeps open ones", async () => {
    let now = Date.parse("2026-01-01T00:00:00Z");
    const store = new TaskStore(await migrated(), () => new Date(now));
    const mk = (id: string) =>
      store.insertTask({
        task_id: id,
        principal_id: "alice",
        project_id: "demo",
        title: "",
        instruction: "x",
        instruction_bytes: 1,
        request_fingerprint: "f",
      });
    await mk("t-open");
    await mk("t-closed");
    await store.insertAttempt({
      attempt_id: "a1",
      task_id: "t-closed",
      assignee: "h",
      fence: 1,
      lease_expires_ms: now,
      superseded_run_id: null,
    });
    await store.closeTask("t-closed", "succeeded");
    expect(await store.prune(1000)).toBe(0);
    now += 2000;
    expect(await store.prune(1000)).toBe(1);
    expect(await store.task("t-closed")).toBeUndefined();
    expect(await store.attempt("a1")).toBeUndefined();
    expect((await store.task("t-open"))?.state).toBe("open");
  });

  it("keeps at most maxClosed closed tasks, dropping the oldest closed first", async () => {
    let now = Date.parse("2026-01-01T00:00:00Z");
    const store = new TaskStore(await migrated(), () => new Date(now));
    for (const id of ["t1", "t2", "t3"]) {
      await store.insertTask({
        task_id: id,
        principal_id: "alice",
        project_id: "demo",
        title: "",
        instruction: "x",
        instruction_bytes: 1,
        request_fingerprint: "f",
      });
      await store.closeTask(id, "abandoned");
      now += 1000;
    }
    expect(await store.prune(3_600_000, 2)).toBe(1);
    expect(await store.task("t1")).toBeUndefined();
    expect(await store.task("t2")).toBeDefined();
    expect(await store.task("t3")).toBeDefined();
  });
});
