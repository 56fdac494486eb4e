/**
 * What is durable when run.start is answered (design §5: the Runner admits — a durable row — before
 * replying). The admission row commits without an fsync of its own, the agent is forked, and the child's
 * identity commits with one (it makes the admission durable too) before the answer; a run that ends before
 * any spawn gets an explicit fsync'd commit first. Real RunManager, real SQLite store, the real fake agent.
 * Crash behaviour (kill -9 right after admission keeps the row) is crash-matrix.test.ts's after_admission case.
 */
import Database from "better-sqlite3";
import { afterAll, afterEach, describe, expect, it, vi } from "vitest";
import { makeWorkspace, newManager, startRequest, writeConfig } from "../support/harness.js";

const ws = makeWorkspace();
afterAll(() => ws.cleanup());
afterEach(() => {
  vi.restoreAllMocks();
});

type Step = string;

/** Each write to the runs table as "VERB what@level" (level: 1 NORMAL, 2 FULL, in force when it ran). */
function recordRunWrites(steps: Step[]): void {
  const probe = new Database(":memory:");
  const proto = Object.getPrototypeOf(probe.prepare("SELECT 1")) as { run: (...a: unknown[]) => unknown };
  probe.close();
  const run = proto.run;
  vi.spyOn(proto, "run").mockImplementation(function (this: Database.Statement, ...args: unknown[]): unknown {
    const sql = this.source.replace(/\s+/g, " ").trim();
    const level = this.database.pragma("synchronous", { simple: true });
    if (sql.startsWith("INSERT INTO runs")) steps.push(`admit@${level}`);
    else if (sql.startsWith("UPDATE runs SET phase = 'setup'")) {
      const params = args[0] as { pgid: number | null };
      steps.push(`child ${params.pgid === null ? "none" : "pgid"}@${level}`);
    } else if (sql.startsWith("UPDATE runs SET updated_at")) steps.push(`touch@${level}`);
    return run.apply(this, args);
  });
}

describe("admission durability when run.start is answered", () => {
  it("forks the agent before the admission's fsync, and answers only after a FULL commit that covers it", async () => {
    const { manager, store } = newManager(writeConfig(ws));
    try {
      const steps: Step[] = [];
      recordRunWrites(steps);
      const request = startRequest(manager, "scenario: hello");
      const started = await manager.start(request);
      steps.push("answered");
      expect(started.ok).toBe(true);
      // admit@1: no fsync of its own; the child row carries the forked group's id, fsync'd, before the answer.
      expect(steps.slice(0, 3)).toEqual(["admit@1", "child pgid@2", "answered"]);
      vi.restoreAllMocks();
      await manager.whenSettled(request.run_id);
      expect(store.get(request.run_id)).toMatchObject({ phase: "terminal", state: "completed" });
    } finally {
      await manager.close();
    }
  });

  it("makes the admission durable before answering a run that ends before any spawn", async () => {
    const config = writeConfig(ws, { agents: [{ env: { PATH: "PATH", TOKEN: "WC_TEST_SOURCE_THAT_IS_NOT_SET" } }] });
    const { manager, store } = newManager(config);
    try {
      const steps: Step[] = [];
      recordRunWrites(steps);
      const request = startRequest(manager, "scenario: hello");
      const started = await manager.start(request);
      steps.push("answered");
      expect(started.ok).toBe(true);
      expect(steps.slice(0, 3)).toEqual(["admit@1", "touch@2", "answered"]);
      vi.restoreAllMocks();
      await manager.whenSettled(request.run_id);
      expect(store.get(request.run_id)).toMatchObject({
        phase: "terminal",
        state: "failed",
        execution_state: "not_started",
        failure_kind: "missing_env",
      });
    } finally {
      await manager.close();
    }
  });
});
