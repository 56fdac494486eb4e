/**
 * Start-to-dispatch latency: from the moment a client asks for a run to the
 * fake agent receiving session/prompt (its ledger's hr_ms, same clock).
 * Baseline and ours alternate run by run (ABAB…) so both see the same
 * machine load; the machines this runs on are shared and noisy.
 */
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import { join } from "node:path";
import { setImmediate as nextTurn, setTimeout as sleep } from "node:timers/promises";
import { execa } from "execa";
import { agentEnv, openBareSession } from "../lib/acp-client.mjs";
import { LedgerReader } from "../lib/ledger.mjs";
import { fakeAgentArgv } from "../lib/paths.mjs";
import { runnerStageTimings } from "../lib/runner-timings.mjs";
import { hrNow, ratio, summarize } from "../lib/stats.mjs";
import { makeTempDir } from "../lib/tmp.mjs";

/**
 * How often both sides look at the ledger while waiting. The figure is the entry's own hr_ms, so this
 * only sets when the bench notices it; a 2 ms poll would spin in the bench process through ours' whole
 * agent start-up (ours waits from the start_coding_agent answer, the bare client only from its
 * session/prompt), taking CPU from the agent it times on a 2-core machine.
 */
const LEDGER_POLL_MS = 25;

/**
 * After each of ours, the bench waits for that run's agent to have exited and the Runner's cleanup to
 * have run, so ours' teardown (the exit handling, the group check) never shares the CPU with the next
 * bare run's agent start-up. Bounded: a hung exit only costs this much, then the bench goes on.
 */
const AGENT_EXIT_WAIT_MS = 2_000;
const AGENT_EXIT_POLL_MS = 5;
const CLEANUP_SETTLE_MS = 20;

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

export async function agentGone(pid) {
  const deadline = Date.now() + AGENT_EXIT_WAIT_MS;
  while (typeof pid === "number" && alive(pid) && Date.now() < deadline) await sleep(AGENT_EXIT_POLL_MS);
  await sleep(CLEANUP_SETTLE_MS);
}

export function helloPrompt() {
  return `scenario: hello\nbench-nonce ${randomUUID()}`;
}

/** One bare ACP SDK run: spawn → initialize → session/new → session/prompt. Returns ms to dispatch. */
async function bareOnce(dir, ledger) {
  const prompt = helloPrompt();
  const t0 = hrNow();
  const session = await openBareSession({ argv: fakeAgentArgv(ledger.file), cwd: dir });
  try {
    const done = session.prompt(prompt);
    const entry = await ledger.waitFor(prompt, 10_000, { pollMs: LEDGER_POLL_MS });
    await done;
    return entry.hr_ms - t0;
  } finally {
    await session.close();
  }
}

/** How long one run of ours may take to reach its agent, and then to end (the `start` suite's runs). */
const DISPATCH_TIMEOUT_MS = 15_000;

/**
 * One run through our stack, observed to its terminal state (`projectId`: another project of the stack's Runner;
 * default its own; `timeoutMs`: the bound on its dispatch and again on its end). `t0` is when the start was sent,
 * on the ledger's clock.
 */
export async function oursOnce(stack, mcp, { projectId = undefined, timeoutMs = DISPATCH_TIMEOUT_MS } = {}) {
  const prompt = helloPrompt();
  const t0 = hrNow();
  const started = await mcp.start({
    provider_id: stack.providerId,
    prompt,
    ...(projectId === undefined ? {} : { project_id: projectId }),
  });
  if (!started.ok) return { error: started.error };
  const entry = await stack.ledger.waitFor(prompt, timeoutMs, { pollMs: LEDGER_POLL_MS });
  const final = await mcp.observeToEnd(started.value.run_id, started.value.observation_token, timeoutMs);
  await agentGone(entry.pid);
  return {
    ms: entry.hr_ms - t0,
    t0,
    run_id: started.value.run_id,
    state: final.state,
    dispatches: stack.ledger.entries(prompt).length,
  };
}

/** Alternates bare and ours `runs` times (bounded by time too). `stack` may be null (baseline only). */
export async function measure(ctx, { stack, runs }) {
  const dir = makeTempDir("start-baseline");
  const ledger = new LedgerReader(join(dir, "ledger.jsonl"));
  const bare = [];
  const ours = [];
  const failures = [];
  let duplicates = 0;
  let oursError = null;
  const mcp = stack ? await stack.mcpClient() : null;
  const deadline = Date.now() + ctx.budgetMs(150_000);
  try {
    for (let i = 0; i < runs && Date.now() < deadline; i++) {
      bare.push(await bareOnce(dir, ledger));
      if (!mcp || oursError) continue;
      try {
        const r = await oursOnce(stack, mcp);
        if (r.error) {
          failures.push(r.error);
          continue;
        }
        ours.push(r.ms);
        if (r.state !== "completed") failures.push({ run_id: r.run_id, state: r.state });
        if (r.dispatches !== 1) duplicates++;
      } catch (error) {
        oursError = String(error?.message ?? error);
      }
    }
  } finally {
    await mcp?.close();
  }
  return {
    baseline: { runs: bare.length, latency_ms: summarize(bare), samples_ms: bare },
    ours: stack
      ? {
          runs: ours.length,
          latency_ms: summarize(ours),
          samples_ms: ours,
          failures: failures.slice(0, 5),
          failure_count: failures.length,
          duplicate_dispatches: duplicates,
          stages: runnerStageTimings(join(stack.dir, "runner.log")),
        }
      : null,
    error: oursError,
  };
}

/**
 * Start-to-dispatch with the Server's state on SQLite and on PostgreSQL, the two stacks alternating run by
 * run (ABAB…) so both see the same machine load. Same path as `measure`'s ours; the ratio PostgreSQL ÷
 * SQLite is the cost of the shared database on a start (its commits, its locks, one network hop each).
 */
export async function measureEngines(ctx, { sqlite, postgres, runs }) {
  const samples = { sqlite: [], postgres: [] };
  const failures = [];
  let duplicates = 0;
  const clients = { sqlite: await sqlite.mcpClient(), postgres: await postgres.mcpClient() };
  const stacks = { sqlite, postgres };
  const deadline = Date.now() + ctx.budgetMs(150_000);
  try {
    for (let i = 0; i < runs && Date.now() < deadline; i++) {
      for (const engine of ["sqlite", "postgres"]) {
        const r = await oursOnce(stacks[engine], clients[engine]);
        if (r.error) {
          failures.push({ engine, error: r.error });
          continue;
        }
        samples[engine].push(r.ms);
        if (r.state !== "completed") failures.push({ engine, run_id: r.run_id, state: r.state });
        if (r.dispatches !== 1) duplicates++;
      }
    }
  } finally {
    await clients.sqlite.close();
    await clients.postgres.close();
  }
  return {
    sqlite: { runs: samples.sqlite.length, latency_ms: summarize(samples.sqlite), samples_ms: samples.sqlite },
    postgres: { runs: samples.postgres.length, latency_ms: summarize(samples.postgres), samples_ms: samples.postgres },
    failures: failures.slice(0, 5),
    failure_count: failures.length,
    duplicate_dispatches: duplicates,
  };
}

/** The agent of the follow-up cell's stacks (launchStack `keepAgentAliveSecs`): sessions that can be continued. */
const CONTINUE_PROVIDER = "fake-continue";

/** One turn of a chain: `continue_run_id` = the previous turn (none for the first), observed to its end. */
async function turnOnce(stack, mcp, previous) {
  const prompt = helloPrompt();
  const t0 = hrNow();
  const started = await mcp.start({
    provider_id: CONTINUE_PROVIDER,
    prompt,
    ...(previous ? { continue_run_id: previous.run_id } : {}),
  });
  if (!started.ok) return { error: started.error };
  const entry = await stack.ledger.waitFor(prompt, 15_000, { pollMs: LEDGER_POLL_MS });
  const final = await mcp.observeToEnd(started.value.run_id, started.value.observation_token, 15_000);
  return {
    ms: entry.hr_ms - t0,
    run_id: started.value.run_id,
    pid: entry.pid,
    state: final.state,
    dispatches: stack.ledger.entries(prompt).length,
  };
}

/**
 * Follow-up start-to-dispatch, cold against warm (design §17, `[acp] keep_agent_alive_secs`): on each stack a
 * chain of turns, each continuing the one before; a follow-up is timed from its start_coding_agent to its
 * prompt in the agent's ledger. `cold` (keep 0) spawns, initializes and resumes the session every turn; the
 * bench waits for the previous turn's agent to exit first, as `measure` does. `warm` (keep > 0) prompts the
 * previous turn's live agent (`warm_hits`: follow-ups whose prompt reached the previous turn's pid). The two
 * chains alternate turn by turn, so both see the same machine load.
 */
export async function measureFollowUp(ctx, { cold, warm, runs }) {
  const stacks = { cold, warm };
  const clients = { cold: await cold.mcpClient(), warm: await warm.mcpClient() };
  const samples = { cold: [], warm: [] };
  const previous = { cold: null, warm: null };
  const failures = [];
  let duplicates = 0;
  let warmHits = 0;
  const deadline = Date.now() + ctx.budgetMs(150_000);
  try {
    // Turn 0 of each chain is a fresh run (not timed); turns 1..runs are follow-ups.
    for (let i = 0; i <= runs && Date.now() < deadline; i++) {
      for (const kind of ["cold", "warm"]) {
        const before = previous[kind];
        if (kind === "cold" && before) await agentGone(before.pid);
        const r = await turnOnce(stacks[kind], clients[kind], before);
        if (r.error) {
          failures.push({ kind, error: r.error });
          previous[kind] = null;
          continue;
        }
        if (r.state !== "completed") failures.push({ kind, run_id: r.run_id, state: r.state });
        if (r.dispatches !== 1) duplicates++;
        if (before) {
          samples[kind].push(r.ms);
          if (kind === "warm" && r.pid === before.pid) warmHits++;
        }
        previous[kind] = r.state === "completed" ? r : null;
      }
    }
  } finally {
    await clients.cold.close();
    await clients.warm.close();
  }
  return {
    cold: { runs: samples.cold.length, latency_ms: summarize(samples.cold), samples_ms: samples.cold },
    warm: { runs: samples.warm.length, latency_ms: summarize(samples.warm), samples_ms: samples.warm },
    warm_hits: warmHits,
    failures: failures.slice(0, 5),
    failure_count: failures.length,
    duplicate_dispatches: duplicates,
  };
}

/** How long a spawn-cost child may take to exit after SIGKILL before the bench goes on. */
const SPAWN_COST_EXIT_WAIT_MS = 2_000;

/**
 * One spawn of the fake agent, as the Runner spawns it (exact env, own group, stdio pipes read as they
 * arrive), through execa with the Runner's options (process/spawn.ts) or through node:child_process.
 * `call_ms`: the synchronous spawn call (option handling, fork and exec). `cpu_ms`: this process's CPU
 * from before the call until the `spawn` event and one more event-loop turn (execa's deferred stream
 * setup), the work that shares the machine with the booting agent. The agent is killed right after.
 */
async function spawnOnce(how, argv, cwd) {
  const options = { cwd, env: agentEnv(), detached: true, stdio: ["pipe", "pipe", "pipe"] };
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const child =
    how === "execa"
      ? execa(argv[0], argv.slice(1), { ...options, extendEnv: false, buffer: false, reject: false, cleanup: false })
      : spawn(argv[0], argv.slice(1), options);
  const callMs = performance.now() - t0;
  await once(child, "spawn");
  child.stdout.on("data", () => {});
  child.stderr.on("data", () => {});
  await nextTurn();
  const cpu = process.cpuUsage(cpu0);
  const exited = once(child, "exit");
  try {
    process.kill(-child.pid, "SIGKILL");
  } catch {
    // already gone
  }
  await Promise.race([exited, sleep(SPAWN_COST_EXIT_WAIT_MS)]);
  return { callMs, cpuMs: (cpu.user + cpu.system) / 1000 };
}

/**
 * What execa adds to a start: `runs` spawns each way, alternating (the same agent argv as the baseline).
 * Shown in the start-to-dispatch breakdown; ratios are execa ÷ node:child_process of the medians.
 */
export async function spawnCost(ctx, { runs }) {
  const dir = makeTempDir("spawn-cost");
  const argv = fakeAgentArgv(join(dir, "ledger.jsonl"));
  const samples = { child_process: { call: [], cpu: [] }, execa: { call: [], cpu: [] } };
  const deadline = Date.now() + ctx.budgetMs(60_000);
  for (let i = 0; i < runs && Date.now() < deadline; i++) {
    for (const how of ["child_process", "execa"]) {
      const r = await spawnOnce(how, argv, dir);
      samples[how].call.push(r.callMs);
      samples[how].cpu.push(r.cpuMs);
    }
  }
  const side = (how) => ({ call_ms: summarize(samples[how].call), cpu_ms: summarize(samples[how].cpu) });
  const out = { child_process: side("child_process"), execa: side("execa") };
  return {
    ...out,
    call_ratio: ratio(out.execa.call_ms.p50, out.child_process.call_ms.p50),
    cpu_ratio: ratio(out.execa.cpu_ms.p50, out.child_process.cpu_ms.p50),
  };
}
