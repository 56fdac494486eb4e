/**
 * Issue 5 acceptance: a real Server (in-process startServer, or a
 * `webcodex-server` child process for kill -9), real Runner daemons
 * (`webcodex-runner run`) and the fake ACP agent, over real WebSocket and
 * stdio. The fake agent's ledger proves how often a prompt was dispatched.
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { isTerminalState, type RunEvent } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import { CLI_BIN, DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import type { ObserveOutput, StartInput } from "../../src/runs/api.js";
import { deriveRunId } from "../../src/runs/identity.js";
import { okValue, ProcStack } from "../support/proc-stack.js";
import { ok as okTool } from "../support/tool-calls.js";

const execFileP = promisify(execFile);

const SLOW = "scenario: slow interval_ms=100 count=600";

function input(key: string, prompt = "scenario: hello", project = "demo"): StartInput {
  return { project_id: project, provider_id: "fake", idempotency_key: key, prompt };
}

/** Observe with tokens until `done` holds; returns the last view and every event seen (in order). */
async function observeUntil(
  s: ProcStack,
  runId: string,
  token: string | undefined,
  done: (o: ObserveOutput, events: RunEvent[]) => boolean,
  timeoutMs = 30_000,
): Promise<{ last: ObserveOutput; events: RunEvent[] }> {
  const events: RunEvent[] = [];
  const deadline = Date.now() + timeoutMs;
  let cursor = token;
  for (;;) {
    const o = okValue(
      await s.observe("alice", { run_id: runId, ...(cursor ? { after_observation_token: cursor } : {}), wait_secs: 5 }),
    );
    events.push(...o.events);
    cursor = o.observation_token;
    if (done(o, events)) return { last: o, events };
    if (Date.now() > deadline) throw new Error(`run ${runId} did not reach the condition; last state ${o.state}`);
  }
}

const terminal = (o: ObserveOutput) => isTerminalState(o.state) && !o.has_more;

describe("Server <-> Runner acceptance", () => {
  let s: ProcStack | undefined;
  afterEach(async () => {
    await s?.stop();
    s = undefined;
  });

  it("runs the happy path end to end, replays the same key without a second dispatch, and refuses a conflicting intent", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    await s.startRunner("r1");
    const started = okValue(await s.start("alice", input("happy")));
    expect(started.replayed).toBe(false);
    const { last, events } = await observeUntil(s, started.run_id, started.observation_token, terminal);
    expect(last).toMatchObject({ state: "completed", execution_state: "completed", stop_reason: "end_turn" });
    expect(events.some((e) => e.kind === "agent_message")).toBe(true);
    expect(events.at(-1)?.kind).toBe("terminal");
    expect(events.map((e) => e.seq)).toEqual(events.map((_, i) => i + 1));

    const replay = okValue(await s.start("alice", input("happy")));
    expect(replay).toMatchObject({ run_id: started.run_id, replayed: true, state: "completed" });
    const conflict = await s.start("alice", input("happy", "scenario: hello\nsomething else"));
    expect(conflict).toMatchObject({ ok: false, error: { code: "idempotency_conflict" } });
    expect(s.prompts("r1")).toHaveLength(1);
  });

  it("meets the original run after the Server is killed mid-run and restarted, and keeps observing it", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }], server: "child" }).init();
    await s.startRunner("r1");
    const started = okValue(await s.start("alice", input("restart-me", "scenario: slow interval_ms=100 count=30")));
    const before = await observeUntil(s, started.run_id, started.observation_token, (_o, ev) => ev.length > 0);
    await s.killServer("SIGKILL");
    await s.startServer();
    await poll(async () => (await s?.projects("alice"))?.[0]?.runner_online, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "runner back online",
    });

    const replay = okValue(await s.start("alice", input("restart-me", "scenario: slow interval_ms=100 count=30")));
    expect(replay).toMatchObject({ run_id: started.run_id, replayed: true });
    // A token from before the restart still works (same Runner instance) ...
    const cont = await observeUntil(s, started.run_id, before.last.observation_token, terminal);
    expect(cont.events[0]?.seq).toBeGreaterThan(before.events.at(-1)?.seq ?? 0);
    expect(cont.last.history_lost).toBe(false);
    // ... and a fresh baseline shows the run from the Runner's ring.
    const base = okValue(await s.observe("alice", { run_id: started.run_id }));
    expect(base.events[0]?.seq).toBe(1);
    expect(cont.last.state).toBe("completed");
    expect(s.prompts("r1")).toHaveLength(1);
  });

  it("recovers runs after a Runner kill -9: the dispatched run is lost, old tokens give history_lost", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    await s.startRunner("r1");
    const started = okValue(await s.start("alice", input("runner-crash", SLOW)));
    const before = await observeUntil(s, started.run_id, started.observation_token, (_o, ev) => ev.length > 0);
    await s.killRunner("r1", "SIGKILL");
    await s.waitOffline("r1");
    const offline = okValue(
      await s.observe("alice", { run_id: started.run_id, after_observation_token: before.last.observation_token }),
    );
    expect(offline).toMatchObject({ state: "running", runner_offline: true });
    await s.startRunner("r1");
    const after = await observeUntil(s, started.run_id, before.last.observation_token, (o) => o.state === "lost");
    expect(after.last).toMatchObject({ state: "lost", execution_state: "outcome_unknown" });
    expect(after.last.history_lost || after.events.length === 0).toBe(true);
    const lostView = okValue(
      await s.observe("alice", { run_id: started.run_id, after_observation_token: before.last.observation_token }),
    );
    expect(lostView.history_lost).toBe(true);
    expect(okValue(await s.start("alice", input("runner-crash", SLOW))).replayed).toBe(true);
    expect(s.prompts("r1")).toHaveLength(1);
  });

  it("rejects a stale runner instance before spawn when the Runner restarts between resolve and dispatch", async () => {
    s = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      // The delay only bounds how long the Runner restart below may take; the window opens at an observed state.
      serverEnv: { WEBCODEX_TEST_HOOK_DELAY_AFTER_RESOLVE_MS: "8000" },
    }).init();
    await s.startRunner("r1");
    const pending = s.start("alice", input("fence"));
    // Resolved: the record (with the fences) is written just before the hook's pause.
    const store = s.inproc?.store;
    if (!store) throw new Error("in-process Server expected");
    await poll(() => store.get(deriveRunId(store.serverSecret, "alice", "fence")), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the start to resolve",
    });
    await s.killRunner("r1", "SIGTERM");
    await s.startRunner("r1");
    const res = await pending;
    expect(res).toMatchObject({ ok: false, error: { code: "stale_runner", recovery_kind: "retry_same" } });
    expect(s.prompts("r1")).toHaveLength(0);
    const retried = okValue(await s.start("alice", input("fence")));
    const { last } = await observeUntil(s, retried.run_id, retried.observation_token, terminal);
    expect(last.state).toBe("completed");
    expect(s.prompts("r1")).toHaveLength(1);
  });

  it("marks a run lost when the Runner comes back with a new store", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    await s.startRunner("r1");
    const started = okValue(await s.start("alice", input("store", SLOW)));
    await observeUntil(s, started.run_id, started.observation_token, (_o, ev) => ev.length > 0);
    await s.killRunner("r1", "SIGKILL");
    await s.waitOffline("r1");
    await s.startRunner("r1", ["--new-store"]);
    const { last } = await observeUntil(s, started.run_id, undefined, (o) => o.state === "lost");
    expect(last).toMatchObject({
      state: "lost",
      execution_state: "outcome_unknown",
      failure_kind: "runner_store_changed",
    });
    expect(s.prompts("r1")).toHaveLength(1);
  });

  it("routes two projects to their two runners and wakes waiting observers when an event exists instead of at the end of their wait", async () => {
    s = await new ProcStack({
      runners: [
        { id: "r1", projects: ["demo"] },
        { id: "r2", projects: ["other"] },
      ],
    }).init();
    await Promise.all([s.startRunner("r1"), s.startRunner("r2")]);
    const a = okValue(await s.start("alice", input("a")));
    const b = okValue(await s.start("alice", input("b", "scenario: slow interval_ms=400 count=10", "other")));
    await observeUntil(s, a.run_id, a.observation_token, terminal);
    // Wake-up: an observe that is already waiting when the next event is made returns with that event
    // instead of sleeping out its wait (a state-only change may wake it too, without events). How fast is the bench's business (observe wake latency), not this test's.
    let token = b.observation_token;
    let woken = 0;
    for (let i = 0; i < 40 && woken < 4; i++) {
      const t0 = Date.now();
      const o = okValue(await s.observe("alice", { run_id: b.run_id, after_observation_token: token, wait_secs: 20 }));
      token = o.observation_token;
      if (isTerminalState(o.state)) break;
      const first = o.events[0];
      if (first && Date.parse(first.at) > t0) {
        woken++;
        expect(Date.now() - t0).toBeLessThan(20_000); // returned on the event, not at the end of the wait
      }
    }
    expect(woken).toBeGreaterThanOrEqual(4);
    await observeUntil(s, b.run_id, token, terminal);
    expect(s.prompts("r1")).toHaveLength(1);
    expect(s.prompts("r2")).toHaveLength(1);
  });

  it("tells a caller that events it never saw are gone after the whole stack restarts, and not one who saw them all", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }], server: "child" }).init();
    await s.startRunner("r1");
    const started = okValue(await s.start("alice", input("history-after-restart")));
    const seen = await observeUntil(s, started.run_id, started.observation_token, terminal);
    expect(seen.last.state).toBe("completed");
    const lastSeq = seen.events.at(-1)?.seq ?? 0;
    expect(lastSeq).toBeGreaterThan(1);
    // A clean restart of both daemons, as when the demo is stopped and started again.
    await s.killServer("SIGTERM");
    await s.killRunner("r1", "SIGTERM");
    await s.startServer();
    await s.startRunner("r1");

    // Without a token (seen nothing) and with the start's token (seen nothing): every event is gone.
    const baseline = okValue(await s.observe("alice", { run_id: started.run_id }));
    expect(baseline).toMatchObject({ state: "completed", events: [], history_lost: true });
    const fromStart = okValue(
      await s.observe("alice", { run_id: started.run_id, after_observation_token: started.observation_token }),
    );
    expect(fromStart).toMatchObject({ state: "completed", events: [], history_lost: true });
    // Its fresh token has nothing more to lose.
    const again = okValue(
      await s.observe("alice", { run_id: started.run_id, after_observation_token: baseline.observation_token }),
    );
    expect(again).toMatchObject({ events: [], history_lost: false });
    // A caller who had seen through the terminal event lost nothing.
    const seenAll = okValue(
      await s.observe("alice", { run_id: started.run_id, after_observation_token: seen.last.observation_token }),
    );
    expect(seenAll).toMatchObject({ state: "completed", events: [], history_lost: false });

    // The same over MCP ...
    const client = await s.mcp("alice");
    expect(await okTool(client, "observe_coding_agent", { run_id: started.run_id })).toMatchObject({
      events: [],
      history_lost: true,
    });
    expect(
      await okTool(client, "observe_coding_agent", {
        run_id: started.run_id,
        after_observation_token: seen.last.observation_token,
      }),
    ).toMatchObject({ history_lost: false });
    // ... and in the CLI's output.
    const env = {
      ...process.env,
      WEBCODEX_URL: `http://127.0.0.1:${s.port}/mcp`,
      WEBCODEX_TOKEN: s.principalTokens.get("alice") ?? "",
      NO_COLOR: "1",
    };
    const json = await execFileP(process.execPath, [CLI_BIN, "observe", started.run_id, "--json"], { env });
    const lines = json.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { type: string });
    expect(lines[0]).toEqual({ type: "history_lost", run_id: started.run_id });
    const text = await execFileP(process.execPath, [CLI_BIN, "observe", started.run_id], { env });
    expect(text.stdout).toContain("earlier events of this run are no longer available");
    expect(s.prompts("r1")).toHaveLength(1);
  });

  it("settles a start whose answer was lost to a Runner crash right after admission as failed/not_started", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    await s.startRunner("r1", [], { WEBCODEX_FAILPOINT: "after_admission" });
    const started = okValue(await s.start("alice", input("crash-after-admission")));
    expect(started).toMatchObject({ state: "starting", execution_state: "not_started", replayed: false });
    await s.waitOffline("r1");
    await s.killRunner("r1");
    await s.startRunner("r1");
    const { last } = await observeUntil(s, started.run_id, started.observation_token, (o) => isTerminalState(o.state));
    expect(last).toMatchObject({ state: "failed", execution_state: "not_started" });
    expect(okValue(await s.start("alice", input("crash-after-admission")))).toMatchObject({
      run_id: started.run_id,
      replayed: true,
      state: "failed",
    });
    expect(s.prompts("r1")).toHaveLength(0);
  });
});
