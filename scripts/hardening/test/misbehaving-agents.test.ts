/**
 * Issue 16 §3: every fake-agent fault, `max_concurrent_runs` runs at once,
 * 20× each in the full suite (one batch in `npm test`), against a real Runner
 * driven by the fake Server. Each run must end in the state design §3/§4.3
 * gives it within its deadline; afterwards no agent process (or grandchild)
 * survives and the Runner holds no more file descriptors than before.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../test-support/index.js";
import { type RunView, startFrame, waitTerminal } from "./support/drive.js";
import { FakeServer } from "./support/fake-server.js";
import { fdCount, size } from "./support/profile.js";
import { RunnerProc } from "./support/runner-proc.js";

const CONCURRENT = 4;
const REPEATS = size(20, CONCURRENT);
/**
 * Setup deadline and cancel grace of the Runner under test (seconds). The setup deadline is what every fault
 * after the barrier must first get past: at 2 s, all of them ended failed/not_started in a CI run whose soak
 * (the other worker) was in its full-capacity cycles, four node agents starting at once on two busy cores.
 */
const SETUP_TIMEOUT_SECS = 6;
const CANCEL_GRACE_SECS = 1;
/** Deadline of the runs whose fault is not "never answers the prompt" (beyond any expected end). */
const RUN_TIMEOUT_SECS = 20;
/** Bound on one run reaching its terminal state: the longest deadline here (run timeout + grace) plus slack. */
const TERMINAL_WITHIN_MS = 45_000;
/** Descriptors the Runner may hold beyond its warmed-up count (SQLite may open its WAL index lazily). */
const FD_SLACK = 2;
/** How long the Runner's descriptors may take to settle after the last run's cleanup. */
const FD_SETTLE_MS = 10_000;

interface Fault {
  name: string;
  prompt: string;
  provider?: string;
  timeoutSecs?: number;
  expect: Partial<RunView>;
}

/** design §3: faults before the barrier → failed/not_started; after it → lost/outcome_unknown (never redispatched). */
const FAULTS: Fault[] = [
  {
    name: "garbage stdout line",
    prompt: "scenario: malformed",
    expect: { state: "lost", execution_state: "outcome_unknown" },
  },
  {
    name: "oversized stdout line",
    prompt: "scenario: oversized bytes=9000000",
    expect: { state: "lost", execution_state: "outcome_unknown" },
  },
  {
    name: "never answers initialize",
    prompt: "scenario: hello",
    provider: "hang_init",
    expect: { state: "failed", execution_state: "not_started", failure_kind: "setup_timeout" },
  },
  {
    name: "never answers session/new",
    prompt: "scenario: hello",
    provider: "hang_new",
    expect: { state: "failed", execution_state: "not_started", failure_kind: "setup_timeout" },
  },
  {
    name: "never answers the prompt (run deadline)",
    prompt: "scenario: hang",
    timeoutSecs: SETUP_TIMEOUT_SECS,
    expect: { state: "lost", execution_state: "outcome_unknown" },
  },
  {
    name: "floods updates",
    prompt: `scenario: burst count=${size(20_000, 4_000)} chunk=64`,
    expect: { state: "completed", stop_reason: "end_turn" },
  },
  {
    name: "closes stdout and lives on",
    prompt: "scenario: close_stdout",
    expect: { state: "lost", execution_state: "outcome_unknown" },
  },
  {
    name: "exits mid-turn",
    prompt: "scenario: crash_before_response",
    expect: { state: "lost", execution_state: "outcome_unknown" },
  },
  {
    name: "exits during initialize",
    prompt: "scenario: hello",
    provider: "exit_init",
    expect: { state: "failed", execution_state: "not_started" },
  },
  { name: "forks a grandchild that ignores SIGTERM", prompt: "scenario: grandchild", expect: { state: "completed" } },
  {
    name: "unknown stop reason",
    prompt: "scenario: stop reason=bogus",
    expect: { state: "failed", failure_kind: "protocol_violation", stop_reason: null },
  },
  { name: "sends fs/read_text_file", prompt: "scenario: fs_request", expect: { state: "completed" } },
  { name: "sends terminal/create", prompt: "scenario: terminal_request", expect: { state: "completed" } },
  { name: "answers the prompt with a JSON-RPC error", prompt: "scenario: prompt_error", expect: { state: "failed" } },
];

describe("misbehaving agents against a real Runner", () => {
  let server: FakeServer;
  let runner: RunnerProc;
  let fdBaseline = 0;

  beforeAll(async () => {
    server = await new FakeServer().start();
    runner = new RunnerProc({
      url: server.url,
      token: server.token,
      maxConcurrentRuns: CONCURRENT,
      acp: { setup_timeout_secs: SETUP_TIMEOUT_SECS, cancel_grace_secs: CANCEL_GRACE_SECS },
      agents: [
        { id: "hang_init", args: ["--hang-on", "initialize"] },
        { id: "hang_new", args: ["--hang-on", "session_new"] },
        { id: "exit_init", args: ["--exit-during-initialize"] },
      ],
    });
    runner.start();
    const conn = await server.live();
    // Warm up (first spawn, SQLite pages, the ledger), then take the descriptor baseline.
    await server.request(conn, startFrame(conn, "warmup", "scenario: hello"));
    await waitTerminal(server, "warmup", TERMINAL_WITHIN_MS);
    await poll(() => agents().length === 0, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "no agent left after the warm-up",
    });
    fdBaseline = (await fdCount(runner.child!.pid!))!;
  });

  afterAll(async () => {
    const survivors = await runner?.dispose();
    await server?.close();
    expect(survivors ?? []).toEqual([]);
  });

  /** Live processes under the Runner (agents and anything they spawned in its tree). */
  function agents(): number[] {
    const runnerPid = runner.child!.pid!;
    const parents = new Map<number, number>();
    for (const pid of readdirProc()) {
      try {
        const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
        const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
        if (fields[0] !== "Z") parents.set(pid, Number(fields[1]));
      } catch {}
    }
    const out: number[] = [];
    const queue = [runnerPid];
    while (queue.length > 0) {
      const p = queue.pop()!;
      for (const [child, parent] of parents)
        if (parent === p) {
          out.push(child);
          queue.push(child);
        }
    }
    return out;
  }

  function grandchildPids(): number[] {
    if (!existsSync(runner.ledger)) return [];
    return readFileSync(runner.ledger, "utf8")
      .split("\n")
      .filter((l) => l.includes('"grandchild"'))
      .map((l) => (JSON.parse(l) as { pid: number }).pid);
  }

  const alive = (pid: number) => {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      return !/^\d+ \(.*\) Z /.test(stat);
    } catch {
      return false;
    }
  };

  for (const fault of FAULTS) {
    it(
      `${fault.name}: ${REPEATS} runs, ${CONCURRENT} at a time, end ${JSON.stringify(fault.expect)}; no orphan, no fd leak`,
      async () => {
        const slug = fault.name.replace(/\W+/g, "-");
        const t0 = Date.now();
        for (let batch = 0; batch < REPEATS / CONCURRENT; batch++) {
          const conn = await server.live();
          const labels = Array.from({ length: CONCURRENT }, (_, i) => `${slug}-${batch}-${i}`);
          // Started as soon as the previous batch is terminal, while its agents may still be being stopped: never
          // refused `capacity` for those runs (the Runner waits for their slots, design §4.2).
          const started = await Promise.all(
            labels.map((label) =>
              server.request(
                conn,
                startFrame(conn, label, fault.prompt, {
                  ...(fault.provider ? { providerId: fault.provider } : {}),
                  // Every run has a deadline, so a fault the Runner missed fails this test instead of holding capacity.
                  timeoutSecs: fault.timeoutSecs ?? RUN_TIMEOUT_SECS,
                }),
              ),
            ),
          );
          for (const s of started) expect(s.type, JSON.stringify(s)).toBe("run.start.result");
          const ended = await Promise.all(labels.map((l) => waitTerminal(server, l, TERMINAL_WITHIN_MS)));
          for (const run of ended) expect(run, JSON.stringify(run)).toMatchObject(fault.expect);
        }
        // Every agent (and grandchild) of these runs is gone, and the Runner's descriptors are back to baseline.
        await poll(() => agents().length === 0, {
          timeoutMs: DAEMON_WAIT_MS,
          intervalMs: DAEMON_POLL_MS,
          what: "no agent process left",
        });
        // A grandchild is reparented when its agent exits; the Runner's group kill still has to reach it.
        await poll(() => grandchildPids().every((pid) => !alive(pid)), {
          timeoutMs: DAEMON_WAIT_MS,
          intervalMs: DAEMON_POLL_MS,
          what: "every grandchild gone",
        });
        // Pipes and sockets of the last runs close as their cleanup finishes: wait for that, bounded.
        let fds = 0;
        await poll(
          async () => {
            fds = (await fdCount(runner.child!.pid!))!;
            return fds <= fdBaseline + FD_SLACK;
          },
          {
            timeoutMs: FD_SETTLE_MS,
            intervalMs: DAEMON_POLL_MS,
            what: `Runner fds back to baseline ${fdBaseline} (+${FD_SLACK})`,
          },
        );
        expect(runner.alive).toBe(true);
        console.log(
          `misbehaving agents: ${fault.name} ×${REPEATS} in ${((Date.now() - t0) / 1000).toFixed(1)} s, Runner fds ${fds} (baseline ${fdBaseline})`,
        );
      },
      10 * 60_000,
    );
  }
});

function readdirProc(): number[] {
  return readdirSync("/proc")
    .filter((n) => /^\d+$/.test(n))
    .map(Number);
}
