/**
 * What the seeded chaos files share — seeded-chaos.test.ts (one Server), its webhook and workspace variants, and
 * seeded-chaos-cluster.test.ts (two Server instances on PostgreSQL behind a load balancer): the run scenarios and
 * bounds, the book of each run's first terminal answer, the end-of-chaos invariants drawn from the fake agent's
 * prompt ledger, and (ChaosStack) the one-Server stack's restarts, kills and start-and-replay step.
 */
import { createHash } from "node:crypto";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import { expect } from "vitest";
import type { ApiResult, StartOutput } from "../../../../packages/server/src/runs/api.js";
import type { ProcStack } from "../../../../packages/server/test/support/proc-stack.js";
import { DAEMON_POLL_MS, type LedgerLine, poll, processesMentioning } from "../../../test-support/index.js";

/** What the fake agent does with a run's prompt (its first line). */
export const SCENARIOS = [
  "scenario: hello",
  "scenario: tools",
  "scenario: slow interval_ms=50 count=20",
  "scenario: echo_env name=WC_CANARY",
  "scenario: crash_before_response",
] as const;

/** The index in SCENARIOS of the agent dying with the prompt in hand (its run ends `lost`). */
export const CRASH_SCENARIO = SCENARIOS.indexOf("scenario: crash_before_response");

/** Run states after which nothing changes. */
export const TERMINAL = new Set(["completed", "failed", "cancelled", "lost"]);
/** A run must be terminal this long after the last restart it saw. */
export const TERMINAL_DEADLINE_MS = 60_000;
/** Every chaos run's own timeout. */
export const RUN_TIMEOUT_SECS = 30;
/** The longest delay after a start call at which a step's action (a kill, a cancel) happens; 0 is drawn too. */
export const ACTION_DELAY_MAX_MS = 400;
/** Bound on the Runner coming back online after a chaos step restarted a Server. */
export const RECONNECT_WAIT_MS = 60_000;
/** How many of the Runner's last log lines a refused start's error shows. */
export const RUNNER_LOG_TAIL_LINES = 80;
/** Bound on every agent process being gone once the chaos ends. */
export const AGENTS_GONE_WAIT_MS = 30_000;

export const sha256 = (text: string): string => createHash("sha256").update(text, "utf8").digest("hex");

/** Adds one to `key`'s count. */
export function tally(counts: Map<string, number>, key: string): void {
  counts.set(key, (counts.get(key) ?? 0) + 1);
}

/** What a terminal answer says about the run; a later answer must say exactly the same. */
export interface Seen {
  state: string;
  execution_state: string;
  stop_reason: string | null;
  failure_kind: string | null;
}

/** The fields of an observe answer the book keeps. */
export interface Observed {
  state: string;
  execution_state: string;
  stop_reason?: string | null;
  failure_kind?: string | null;
  recovery_kind?: string;
  /** Whether the run's prompt was in the ledger just before this answer was asked for (undefined: not checked). */
  dispatchedBefore?: boolean | undefined;
}

/**
 * Each run's first terminal answer; every later terminal answer must equal it — except after a rejection
 * before admission that a same-key retry may re-admit (design §6.1: `failed/not_started`, `retry_same`), when
 * that answer was checked against the ledger as it was just before it was asked for (`dispatchedBefore`):
 * then it was true when given (asserted here), and the run's later end replaces it.
 */
export class TerminalBook {
  readonly #first = new Map<string, Seen>();
  /** Runs whose first terminal answer was a retryable rejection, checked against the ledger. */
  readonly #retryable = new Set<string>();

  /**
   * Whether the run's last terminal answer was a retryable rejection (`not_started`, `retry_same`, checked
   * against the ledger): a same-key start then admits it afresh, the same run id with `replayed: false`.
   */
  retryable(runId: string): boolean {
    return this.#retryable.has(runId);
  }

  /** The run's first terminal answer, once one was seen. */
  first(runId: string): Seen | undefined {
    return this.#first.get(runId);
  }

  /**
   * Calls `observe` (null: no answer this time, e.g. a Server being killed) until the run is terminal, within
   * TERMINAL_DEADLINE_MS; records the first terminal answer, asserts any later one equals it, and returns it.
   */
  async untilTerminal(runId: string, observe: () => Promise<Observed | null>): Promise<Seen> {
    let last: Observed | undefined;
    await poll(
      async () => {
        const o = await observe();
        if (!o) return false;
        last = o;
        return TERMINAL.has(o.state);
      },
      { timeoutMs: TERMINAL_DEADLINE_MS, intervalMs: DAEMON_POLL_MS, what: `run ${runId} terminal` },
    );
    const seen: Seen = {
      state: last!.state,
      execution_state: last!.execution_state,
      stop_reason: last!.stop_reason ?? null,
      failure_kind: last!.failure_kind ?? null,
    };
    const retryable =
      seen.execution_state === "not_started" &&
      last!.recovery_kind === "retry_same" &&
      last!.dispatchedBefore !== undefined;
    if (retryable)
      expect(last!.dispatchedBefore, `${runId} not_started (retry_same) but its prompt was in the ledger`).toBe(false);
    const first = this.#first.get(runId);
    if (first && this.#retryable.has(runId) && !isDeepStrictEqual(seen, first)) {
      // Re-admitted by a same-key retry since (or rejected again): its new end replaces the first.
      this.#first.set(runId, seen);
    } else if (first) expect(seen, `terminal state of ${runId} changed`).toEqual(first);
    else this.#first.set(runId, seen);
    if (retryable) this.#retryable.add(runId);
    else if (this.#first.get(runId) === seen) this.#retryable.delete(runId);
    return seen;
  }
}

/** Asserts no prompt is in the ledger twice; returns how often each prompt hash was dispatched (once each). */
export function expectSingleDispatches(prompts: readonly LedgerLine[]): Map<string, number> {
  const dispatches = new Map<string, number>();
  for (const line of prompts) tally(dispatches, String(line.prompt_sha256));
  for (const [h, n] of dispatches) expect(n, `prompt ${h.slice(0, 12)} dispatched ${n} times`).toBe(1);
  return dispatches;
}

/** A run's end agrees with the ledger: never `not_started` once its prompt was dispatched, never `completed` without. */
export function expectTruthfulEnd(key: string, seen: Seen, dispatched: boolean): void {
  if (seen.execution_state === "not_started") expect(dispatched, `${key} not_started but in the ledger`).toBe(false);
  if (seen.state === "completed") expect(dispatched, `${key} completed without a dispatch`).toBe(true);
}

/** Every chaos run's start input, but for its key and prompt (project p1, the fake agent, RUN_TIMEOUT_SECS). */
export function startInput(key: string, prompt: string) {
  return { project_id: "p1", provider_id: "fake", idempotency_key: key, prompt, timeout_secs: RUN_TIMEOUT_SECS };
}

/** SIGKILLs each of `pids` (one already gone is passed over). */
export function killAll(pids: readonly number[]): void {
  for (const pid of pids) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {}
  }
}

/** What a one-Server chaos step does at its moment after the start call. */
export type ChaosAction = "none" | "cancel" | "replay" | "kill_runner" | "kill_server" | "kill_both" | "kill_agent";

/** A start's answer, plain or managed: the run, or why not. */
export type Started = { ok: true; value: { run_id: string; replayed: boolean } } | { ok: false; error: unknown };

/** The end of every run of a chaos, checked against the ledger (expectTruthfulEnds). */
export interface Ended {
  runId: string;
  seen: Seen;
  /** Whether the run's prompt is in the ledger. */
  dispatched: boolean;
}

/**
 * The end-of-chaos pass: no prompt in the ledger twice, and every run (key → run id) terminal, unchanged since
 * first seen terminal, and truthful to the ledger. Returns each key's end, and the count of each
 * `state/execution_state`.
 */
export async function expectTruthfulEnds(
  runOf: ReadonlyMap<string, string>,
  promptOf: (key: string) => string,
  ledger: readonly LedgerLine[],
  observeTerminal: (runId: string) => Promise<Seen>,
): Promise<{ ends: Map<string, Ended>; states: Map<string, number> }> {
  const dispatches = expectSingleDispatches(ledger);
  const ends = new Map<string, Ended>();
  const states = new Map<string, number>();
  for (const [key, runId] of runOf) {
    const seen = await observeTerminal(runId); // also: unchanged since first seen terminal
    tally(states, `${seen.state}/${seen.execution_state}`);
    const dispatched = dispatches.has(sha256(promptOf(key)));
    expectTruthfulEnd(key, seen, dispatched);
    ends.set(key, { runId, seen, dispatched });
  }
  return { ends, states };
}

/** The last RUNNER_LOG_TAIL_LINES lines of the stack's Runner r1's log (JSON lines: run ids, states, never a prompt). */
export function runnerLogTail(stack: ProcStack): string {
  const lines = (stack.logs.get("r1") ?? "").trimEnd().split("\n");
  return `the Runner's last ${RUNNER_LOG_TAIL_LINES} log lines:\n${lines.slice(-RUNNER_LOG_TAIL_LINES).join("\n")}`;
}

/**
 * The one-Server chaos stack (a ProcStack with Server child and Runner "r1", project p1): bringing killed daemons
 * back, a step's kill, and a step's start — the call, the action at its moment, the restarts and the same-key
 * replay that must give the run.
 */
export class ChaosStack {
  constructor(
    readonly stack: ProcStack,
    /** Extra env of the Runner (e.g. a canary mapped into the agent's env). */
    readonly runnerEnv: Record<string, string> = {},
  ) {}

  /** `mustStart` whose refusal shows the Runner's last log lines. */
  mustStart(i: number, key: string, start: () => Promise<Started>): Promise<{ run_id: string; replayed: boolean }> {
    return mustStart(i, key, start, () => runnerLogTail(this.stack));
  }

  /** The fake agents running for r1 (they name its ledger). */
  agentPids(): number[] {
    return processesMentioning(this.stack.ledgerFile("r1"));
  }

  /** Restarts whatever was killed; until the Runner is online again. */
  async ensureUp(): Promise<void> {
    const stack = this.stack;
    if (!stack.serverChild) await stack.startServer();
    if (!stack.runnerProcs.has("r1")) await stack.startRunner("r1", [], this.runnerEnv);
    else
      await poll(async () => (await stack.projects("alice"))[0]?.runner_online, {
        timeoutMs: RECONNECT_WAIT_MS,
        intervalMs: DAEMON_POLL_MS,
        what: "the Runner back online",
      });
  }

  /** A step's kill (SIGKILL of the Runner's pid only, the Server, both, or the agents); other actions do nothing. */
  async act(action: ChaosAction): Promise<void> {
    switch (action) {
      case "kill_runner":
        await this.stack.killRunner("r1", "SIGKILL");
        break;
      case "kill_server":
        await this.stack.killServer("SIGKILL");
        break;
      case "kill_both":
        await this.stack.killRunner("r1", "SIGKILL");
        await this.stack.killServer("SIGKILL");
        break;
      case "kill_agent":
        killAll(this.agentPids());
        break;
      default:
        break;
    }
  }

  /** Alice's plain start. */
  start(input: ReturnType<typeof startInput>): Promise<ApiResult<StartOutput>> {
    return this.stack.start("alice", input);
  }

  /** Follows a run to its terminal answer through alice's observe, recorded in `book`. */
  observeTerminal(book: TerminalBook, runId: string): Promise<Seen> {
    return book.untilTerminal(runId, async () => {
      const o = await this.stack.observe("alice", { run_id: runId }).catch(() => null);
      return o?.ok ? o.value : null;
    });
  }

  /**
   * Step `i` of key `key`: `start` called, `action` taken `delayMs` after (0: at once), the killed brought back,
   * then `start` again, which must give the run — the first call's (when it answered) and the key's earlier one
   * (runOf, which it updates): never a second run.
   */
  async startStep(
    i: number,
    key: string,
    action: ChaosAction,
    delayMs: number,
    start: () => Promise<Started>,
    runOf: Map<string, string>,
  ): Promise<{ run_id: string; replayed: boolean }> {
    const startCall = start().catch(() => null);
    if (delayMs > 0) await new Promise((r) => setTimeout(r, delayMs));
    await this.act(action);
    const first = await startCall;
    await this.ensureUp();
    // The same key again: the same run, never a second one (and never a second dispatch).
    const replay = await this.mustStart(i, key, start);
    if (first?.ok) expect(replay.run_id, `iteration ${i}: replay of ${key}`).toBe(first.value.run_id);
    const known = runOf.get(key);
    if (known) expect(replay.run_id).toBe(known);
    runOf.set(key, replay.run_id);
    return replay;
  }
}

/**
 * `start`'s run, or an error naming the iteration, the key and the refusal — and `context()` (the Runner's last
 * log lines, say), so a refusal that should not happen can be traced from the failure alone.
 */
async function mustStart(
  i: number,
  key: string,
  start: () => Promise<Started>,
  context?: () => string,
): Promise<{ run_id: string; replayed: boolean }> {
  const r = await start();
  if (!r.ok) {
    const more = context ? `\n${context()}` : "";
    throw new Error(`iteration ${i}: start of ${key} refused: ${JSON.stringify(r.error)}${more}`);
  }
  return r.value;
}

/** Every regular file under `dir` (none when it does not exist). */
export function filesUnder(dir: string): string[] {
  if (!existsSync(dir)) return [];
  const files: string[] = [];
  const walk = (at: string) => {
    for (const name of readdirSync(at)) {
      const p = join(at, name);
      const st = statSync(p, { throwIfNoEntry: false });
      if (st?.isDirectory()) walk(p);
      else if (st?.isFile()) files.push(p);
    }
  };
  walk(dir);
  return files;
}

/** Waits until `agentPids` lists no process: no agent outlives its run (a killed Runner's orphans are reaped). */
export async function expectNoAgents(agentPids: () => number[]): Promise<void> {
  await poll(() => agentPids().length === 0, {
    timeoutMs: AGENTS_GONE_WAIT_MS,
    intervalMs: DAEMON_POLL_MS,
    what: "no agent process left",
  });
}

/**
 * Asserts `canary` is in no file under `dir` (state, configs, ledger) and in no daemon log; returns how many
 * files were scanned.
 */
export function expectCanaryAbsent(canary: string, dir: string, logs: ReadonlyMap<string, string>): number {
  const files = filesUnder(dir);
  for (const f of files) expect(readFileSync(f).includes(canary), `canary found in ${f}`).toBe(false);
  for (const [name, log] of logs) expect(log.includes(canary), `canary in the ${name} log`).toBe(false);
  return files.length;
}
