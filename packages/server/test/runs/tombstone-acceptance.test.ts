/**
 * Issue 12 §1 acceptance: absence is never proof. With a tiny Runner
 * retention (retain_terminal_max = 1) a run's row is pruned soon after it
 * ends; the Runner keeps its tombstone, so neither a Server state dir
 * restored from a backup taken before the run, nor a Server that was down
 * while the Runner pruned a run it had sent, leads to a second dispatch of a
 * same-key retry. Real Server and Runner processes, the fake agent's ledger
 * as proof.
 */
import { createHash } from "node:crypto";
import { TOMBSTONE_MESSAGE } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import type { StartInput } from "../../src/runs/api.js";
import { CutProxy } from "../support/cut-proxy.js";
import { okValue, ProcStack } from "../support/proc-stack.js";

/** Bound on the Runner logging both runs terminal while the Server is down. */
const TERMINAL_LOG_WAIT_MS = 30_000;

const A_PROMPT = "scenario: hello\nrun A";

function input(key: string, prompt: string): StartInput {
  return { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt };
}

/** Ledger lines of prompts with this text. */
function dispatches(s: ProcStack, prompt: string): number {
  const sha = createHash("sha256").update(prompt, "utf8").digest("hex");
  return s.prompts("r1").filter((p) => p.prompt_sha256 === sha).length;
}

describe("tombstones: a pruned run is never dispatched twice", () => {
  let s: ProcStack | undefined;
  let proxy: CutProxy | undefined;
  afterEach(async () => {
    await s?.stop();
    await proxy?.close();
    s = undefined;
    proxy = undefined;
  });

  it("a same-key retry after the Server state dir was restored from a backup taken before the run dispatches once", async () => {
    s = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      runnerTable: "retain_terminal_max = 1",
    }).init();
    // The backup: the Server's state (dir, and database on PostgreSQL) before run A existed.
    await s.killServer("SIGTERM");
    await s.backupState();
    await s.startServer();
    await s.startRunner("r1");

    const a = okValue(await s.start("alice", input("key-a", A_PROMPT)));
    expect(await s.untilTerminal(a.run_id)).toMatchObject({ state: "completed" });
    const b = okValue(await s.start("alice", input("key-b", "scenario: hello\nrun B")));
    expect(await s.untilTerminal(b.run_id)).toMatchObject({ state: "completed" });

    // Both stop; the Server's state is restored from the backup. (The Runner is down meanwhile, so it comes
    // back by its own start, not after a reconnect backoff that grew while the Server was away.)
    await s.killRunner("r1", "SIGTERM");
    await s.killServer("SIGTERM");
    await s.restoreState();
    await s.startServer();
    // The Runner restarts: its start-up prune keeps only B's row.
    await s.startRunner("r1");
    await poll(() => s?.logs.get("r1")?.includes("pruned terminal runs"), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "A's row pruned",
    });

    const retry = okValue(await s.start("alice", input("key-a", A_PROMPT)));
    expect(retry).toMatchObject({ run_id: a.run_id, replayed: true, state: "completed" });
    expect(await s.untilTerminal(a.run_id)).toMatchObject({
      state: "completed",
      execution_state: "completed",
      message: TOMBSTONE_MESSAGE,
    });
    // A prompt that was dispatched anyway would be on the ledger by the time the run looks terminal.
    expect(dispatches(s, A_PROMPT)).toBe(1);
  });

  it("a same-key retry after the Server was down while the Runner pruned a run it had sent dispatches once", async () => {
    proxy = await new CutProxy().listen();
    s = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      runnerTable: "retain_terminal_max = 1",
      linkPort: proxy.port,
    }).init();
    proxy.targetPort = s.port;
    await s.startRunner("r1");

    // B runs long enough to end after A, so retention keeps B and prunes A.
    const b = okValue(await s.start("alice", input("key-b", "scenario: slow interval_ms=100 count=20")));
    // A reaches the Runner, but its answer never reaches the Server: the record stays `sent`.
    proxy.cutAfterNextRunStart();
    const a = okValue(await s.start("alice", input("key-a", A_PROMPT)));
    await proxy.cutDone;
    expect(a.replayed).toBe(false);
    // The Server goes down before it ever hears from the Runner again.
    proxy.down();
    await s.killServer("SIGKILL");
    await poll(() => (s?.logs.get("r1")?.match(/"msg":"run terminal"/g)?.length ?? 0) >= 2, {
      timeoutMs: TERMINAL_LOG_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "A and B terminal on the Runner",
    });
    expect(dispatches(s, A_PROMPT)).toBe(1);

    // The Runner restarts while the Server is down (start-up prune drops A's row) ...
    await s.killRunner("r1", "SIGTERM");
    await s.startRunner("r1", [], {}, { waitOnline: false });
    await poll(() => s?.logs.get("r1")?.includes("pruned terminal runs"), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "A's row pruned",
    });
    // ... then the Server comes back and reconciles A against the Runner.
    await s.startServer();
    proxy.up();
    await poll(async () => (await s?.projects("alice"))?.[0]?.runner_online, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "runner back online",
    });
    const settled = await s.untilTerminal(a.run_id);
    expect(settled).toMatchObject({ state: "completed", execution_state: "completed" });

    const retry = okValue(await s.start("alice", input("key-a", A_PROMPT)));
    expect(retry).toMatchObject({ run_id: a.run_id, replayed: true, state: "completed" });
    await s.untilTerminal(a.run_id);
    expect(dispatches(s, A_PROMPT)).toBe(1);
    // Both runs' events went with the Runner's restart (A's with its row): observe says so, once.
    const bView = okValue(await s.observe("alice", { run_id: b.run_id }));
    expect(bView).toMatchObject({ state: "completed", events: [], history_lost: true });
    const aView = okValue(await s.observe("alice", { run_id: a.run_id, after_observation_token: a.observation_token }));
    expect(aView).toMatchObject({ state: "completed", events: [], history_lost: true });
    expect(okValue(await s.observe("alice", { run_id: a.run_id }))).toMatchObject({ history_lost: true });
    const aAgain = okValue(
      await s.observe("alice", { run_id: a.run_id, after_observation_token: aView.observation_token }),
    );
    expect(aAgain).toMatchObject({ state: "completed", events: [], history_lost: false });
  });
});
