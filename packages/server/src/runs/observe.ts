/**
 * Observation (design §6.3 observe_coding_agent): catch the run's mirror up
 * with the Runner's ring (run.sync), then answer the events after the
 * caller's observation token within the output budget, waiting at most
 * `wait_secs` for anything new.
 */
import {
  isTerminalState,
  MAX_EVENTS_PER_OBSERVE,
  MAX_EVENTS_PER_SYNC,
  MAX_OBSERVE_WAIT_SECS,
  OBSERVE_OUTPUT_BUDGET_BYTES,
  RunId,
  utf8Length,
} from "@webcodex/protocol";
import type { LiveRunner } from "../link/registry.js";
import { missingScopes } from "../principals/authority.js";
import type { Principal } from "../principals/principal.js";
import type { ApiResult, ObserveInput, ObserveOutput } from "./api.js";
import { fail, type RunContext } from "./context.js";
import { ObservedLinks } from "./continuation.js";
import type { RunMirror } from "./mirror.js";
import { MAX_OBSERVATION_TOKEN_LENGTH } from "./observe-token.js";
import { recordUsage } from "./usage.js";

const MAX_SYNC_ROUNDS = 32;
const SYNC_TIMEOUT_MS = 10_000;
/** An observe waits at least this long for a catch-up before answering from the mirror as it is. */
const CATCH_UP_MIN_WAIT_MS = 2_000;
/**
 * The seq of a token whose holder was told that a pruned run's events are gone: past any seq a run
 * has, and the largest an observation token carries (runs/observe-token.ts, 15 digits).
 */
export const PAST_PRUNED_SEQ = 10 ** 15 - 1;

export function withTimeout(p: Promise<void>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([p, new Promise<void>((r) => (timer = setTimeout(r, ms)))]).finally(() => clearTimeout(timer));
}

/**
 * Where a caller's view resumes and whether events it has not seen are gone (`history_lost`).
 *
 * - Seen: nothing without a token; through the token's seq with a token of the mirror's Runner instance.
 * - Gone: every seq below `mirror.firstSeq` (the Runner's ring dropped it, the Runner restarted and its
 *   ring is empty, or this Server rebuilt its mirror from a ring that no longer has it); all of a run the
 *   Runner knows only by its tombstone (`pruned`) when this Server holds none of its events either.
 * - A token of another Runner instance counts seqs of that process. The caller provably saw everything
 *   only when the run is terminal and the token is at or past its final seq: a terminal summary's
 *   `last_seq` is exact (the Runner writes it with the terminal event), while a run its Runner settled
 *   after a crash reports 0 — its events cannot be counted, so they count as lost.
 * - Once told, a caller is not told again: the token it gets resumes after what is gone (for a pruned
 *   run, at `PAST_PRUNED_SEQ`).
 */
export function resumePoint(
  mirror: RunMirror,
  cursor: { instance: string; seq: number } | null,
  instance: string,
): { after: number; historyLost: boolean } {
  const gone = mirror.firstSeq - 1;
  const summary = mirror.summary;
  const final = summary !== null && isTerminalState(summary.state) && summary.last_seq > 0 ? summary.last_seq : null;
  const sawAll = (seq: number) => final !== null && seq >= final;
  // A pruned run whose events this Server no longer holds either: none of them can be returned.
  const nothingLeft = mirror.pruned && mirror.size === 0;
  const past = nothingLeft ? PAST_PRUNED_SEQ : gone;
  if (cursor === null) return { after: past, historyLost: gone > 0 || nothingLeft };
  if (cursor.instance !== instance) return { after: past, historyLost: !sawAll(cursor.seq) };
  if (cursor.seq < gone) return { after: past, historyLost: true };
  if (nothingLeft && cursor.seq < PAST_PRUNED_SEQ) return { after: past, historyLost: !sawAll(cursor.seq) };
  return { after: cursor.seq, historyLost: false };
}

export class Observation {
  readonly #ctx: RunContext;
  readonly #links = new ObservedLinks();

  constructor(ctx: RunContext) {
    this.#ctx = ctx;
  }

  async observe(principal: Principal, input: ObserveInput, signal?: AbortSignal): Promise<ApiResult<ObserveOutput>> {
    if (!RunId.safeParse(input.run_id).success) return fail("invalid_input", "run_id is not a run id.", "fix_input");
    if (input.wait_secs !== undefined && (typeof input.wait_secs !== "number" || !(input.wait_secs >= 0))) {
      return fail("invalid_input", "wait_secs must be a number of seconds >= 0.", "fix_input");
    }
    const denied = missingScopes(principal, ["coding_agent:run"], "Observing a coding agent");
    if (denied) return { ok: false, error: denied };
    const rec = await this.#ctx.owned(principal, input.run_id, true);
    if (!rec) return fail("not_found", `No run ${input.run_id}.`, "none");
    let cursor = null;
    if (input.after_observation_token !== undefined) {
      cursor = this.#ctx.tokens.verify(rec.run_id, input.after_observation_token);
      if (!cursor) {
        return fail("invalid_observation_token", "The observation token is not valid for this run.", "reobserve");
      }
    }
    const waitMs = Math.min(input.wait_secs ?? 0, MAX_OBSERVE_WAIT_SECS) * 1000;
    const deadline = Date.now() + waitMs;
    let firstState: string | null = null;
    for (;;) {
      if (this.#ctx.closed) return fail("internal", "The Server is shutting down; observe again shortly.", "reobserve");
      const mirror = this.#ctx.mirrors.getOrCreate(rec.run_id);
      const runner = await this.#ctx.registry.lookupRecent(rec.runner_id, mirror.instance);
      const current = await this.#ctx.store.peek(rec.run_id);
      const admission = current?.admission;
      if (runner && (admission === "admitted" || admission === "sent")) {
        if (mirror.instance !== runner.agentInstanceId) mirror.reset(runner.agentInstanceId);
        const behind = mirror.summary !== null && mirror.summary.last_seq > mirror.lastSeq;
        // The record ended where this mirror did not see it (the link is on another instance, whose
        // notification may still be on its way): fetch the end and the events before it.
        const endMissed =
          current !== undefined &&
          isTerminalState(current.state) &&
          (mirror.summary === null || !isTerminalState(mirror.summary.state));
        if (!mirror.synced || mirror.syncing || behind || endMissed) {
          // A slow Runner must not hold an observe past its own wait: answer with what is held (has_more).
          // A catch-up already in flight may have asked before what this observe saw (the record's end):
          // after it, one of this observe's own.
          const joined = mirror.syncing !== null;
          await withTimeout(this.catchUp(mirror, runner), Math.max(CATCH_UP_MIN_WAIT_MS, deadline - Date.now()));
          if (joined && !this.#ctx.closed) {
            await withTimeout(this.catchUp(mirror, runner), Math.max(CATCH_UP_MIN_WAIT_MS, deadline - Date.now()));
          }
        }
      }
      if (this.#ctx.closed) return fail("internal", "The Server is shutting down; observe again shortly.", "reobserve");
      const version = mirror.version;
      const view = await this.#view(rec.run_id, mirror, cursor, runner === undefined);
      if (!view) return fail("not_found", `No run ${input.run_id}.`, "none");
      // Anything that changes what the caller sees ends the wait: events, state, the Runner going on/offline.
      const shape = `${view.state}|${view.runner_offline === true}`;
      firstState ??= shape;
      const remaining = deadline - Date.now();
      const nothingNew =
        view.events.length === 0 && !view.history_lost && !isTerminalState(view.state) && shape === firstState;
      if (!nothingNew || cursor === null || remaining <= 0 || signal?.aborted || this.#ctx.closed) {
        return { ok: true, value: view };
      }
      await mirror.waitForChange(version, remaining, signal);
      // A Runner's frames are applied one after another, each after its state write (runs/runs.ts
      // `#inOrder`): let the ones that arrived with the frame that woke us land first, so that one
      // answer carries them together (a state change and the events right behind it).
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
  }

  async #view(
    runId: string,
    mirror: RunMirror,
    cursor: { instance: string; seq: number } | null,
    runnerOffline: boolean,
  ): Promise<ObserveOutput | null> {
    const rec = await this.#ctx.store.peek(runId);
    if (!rec) return null;
    const instance = mirror.instance ?? rec.agent_instance_id ?? "no_runner_instance";
    const { after, historyLost } = resumePoint(mirror, cursor, instance);
    const out: ObserveOutput = {
      run_id: runId,
      state: rec.state,
      execution_state: rec.execution_state,
      recovery_kind: rec.recovery_kind,
      events: [],
      observation_token: "",
      history_lost: historyLost,
      has_more: false,
      effective_config: [...rec.effective_config],
    };
    if (rec.stop_reason !== null) out.stop_reason = rec.stop_reason;
    if (rec.failure_kind !== null) out.failure_kind = rec.failure_kind;
    if (rec.message !== null) out.message = rec.message;
    if (runnerOffline && !isTerminalState(rec.state)) out.runner_offline = true;
    const usage = recordUsage(rec);
    if (usage) out.usage = usage;
    const { started_at, ended_at } = mirror.times;
    if (started_at !== null) out.started_at = started_at;
    if (ended_at !== null) out.ended_at = ended_at;
    const workspace = mirror.summary?.workspace;
    if (workspace) out.workspace = workspace;
    Object.assign(out, await this.#links.of(this.#ctx.store.engine, runId, rec.state));
    const candidates = mirror.eventsAfter(after);
    // Budget in UTF-8 bytes of the serialized result, with room reserved for the token.
    let size = utf8Length(JSON.stringify(out)) + MAX_OBSERVATION_TOKEN_LENGTH;
    let lastSeq = after;
    for (const e of candidates) {
      const n = mirror.sizeOf(e) + 1;
      if (out.events.length >= MAX_EVENTS_PER_OBSERVE || size + n > OBSERVE_OUTPUT_BUDGET_BYTES) {
        out.has_more = true;
        break;
      }
      out.events.push(e);
      size += n;
      lastSeq = e.seq;
    }
    // Still behind the Runner (a catch-up failed or is pending): tell the caller to come back.
    if (mirror.summary !== null && mirror.summary.last_seq > lastSeq && mirror.instance === instance)
      out.has_more = true;
    out.observation_token = this.#ctx.tokens.issue({ run_id: runId, instance, seq: lastSeq });
    return out;
  }

  /** Bring a mirror up to the Runner's ring with run.sync(after_seq); one catch-up per mirror at a time. */
  catchUp(mirror: RunMirror, runner: LiveRunner): Promise<void> {
    if (mirror.syncing) return mirror.syncing;
    const p = (async () => {
      for (let round = 0; round < MAX_SYNC_ROUNDS && !this.#ctx.closed; round++) {
        if (runner.conn.closed || mirror.instance !== runner.agentInstanceId) return;
        const after = mirror.lastSeq;
        const unsyncs = mirror.unsyncs;
        const mark = this.#ctx.startMark();
        const res = await runner.conn.request(
          { type: "run.sync", run_id: mirror.runId, after_seq: after, max_events: MAX_EVENTS_PER_SYNC },
          SYNC_TIMEOUT_MS,
        );
        if (!res.ok) return;
        if (mirror.instance !== runner.agentInstanceId) return;
        if (res.frame.type === "error") {
          if (res.frame.code === "not_found") {
            mirror.synced = true;
            await this.#ctx.closeIfNeverAdmitted(mirror.runId, runner, mark);
          } else if (res.frame.tombstone) {
            mirror.synced = true;
            await this.#ctx.applyTombstone(mirror.runId, res.frame.tombstone);
          }
          mirror.touch();
          return;
        }
        if (res.frame.type !== "run.sync.result") return;
        const more = mirror.applySync(after, res.frame.run, res.frame.events, res.frame.has_more);
        await this.#ctx.persist(mirror.runId, res.frame.run, "copy");
        // A change told while this answer was on its way may be newer than it: another round.
        const overtaken = mirror.unsyncs !== unsyncs;
        if (overtaken) mirror.synced = false;
        const behind = mirror.summary !== null && mirror.summary.last_seq > mirror.lastSeq;
        if (!more && !behind && !overtaken) return;
      }
    })();
    // Cleared only after it is set: a catch-up that ends before its first await must not stay "in flight".
    mirror.syncing = p;
    const clear = () => {
      if (mirror.syncing === p) mirror.syncing = null;
    };
    void p.then(clear, clear);
    return p;
  }
}
