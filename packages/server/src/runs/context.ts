/**
 * What admission, observation, cancellation and the hub wiring share: the
 * store, the registry, the mirrors, the token issuer, which starts are in
 * flight, and the few record rules all of them apply (a Runner summary never
 * moves a terminal record back; a `not_found` over the current connection
 * closes a settled `sent` record as never admitted).
 */
import { isTerminalState, type RecoveryKind, type RunSummary, type RunTombstone } from "@webcodex/protocol";
import type { Logger } from "pino";
import type { RunnerConnection } from "../link/hub.js";
import { leaseHolderIn } from "../link/lease-store.js";
import type { LiveRunner, Registry } from "../link/registry.js";
import type { Principal } from "../principals/principal.js";
import type { StateQueries } from "../state/engine.js";
import type { AdmissionRecord, RecordPatch } from "../state/record.js";
import type { StateStore } from "../state/store.js";
import type { ApiErrorCode, ApiResult } from "./api.js";
import { MirrorSet } from "./mirror.js";
import { ObservationTokens } from "./observe-token.js";
import { decideAfterQuery, tombstonePatch } from "./reconcile.js";

export function fail<T>(code: ApiErrorCode, message: string, recovery_kind: RecoveryKind): ApiResult<T> {
  return { ok: false, error: { code, message, recovery_kind } };
}

function summaryPatch(s: RunSummary): RecordPatch {
  return {
    state: s.state,
    execution_state: s.execution_state,
    stop_reason: s.stop_reason,
    failure_kind: s.failure_kind,
    recovery_kind: s.recovery_kind,
    message: s.message,
    effective_config: s.effective_config,
    runner_seq: s.last_seq,
    runner_updated_at: s.updated_at,
    // A summary without usage (none reported yet, or one rebuilt from the Runner's store) keeps what is held.
    ...(s.usage
      ? {
          usage_used_tokens: s.usage.used_tokens,
          usage_context_size: s.usage.context_size,
          usage_cost_amount: s.usage.cost_amount,
          usage_cost_currency: s.usage.cost_currency,
        }
      : {}),
  };
}

/** Whether `s` left the Runner before the summary `rec` last took (see `RunContext.noRegress`). */
export function summaryBehind(s: RunSummary, rec: AdmissionRecord): boolean {
  if (rec.runner_seq === null) return false;
  if (s.last_seq !== rec.runner_seq) return s.last_seq < rec.runner_seq;
  return rec.runner_updated_at !== null && Date.parse(s.updated_at) < Date.parse(rec.runner_updated_at);
}

/** Fields of a summary patch that say where it stands in the Runner's order, not what the run is. */
const ORDER_ONLY: ReadonlySet<keyof RecordPatch> = new Set(["runner_seq", "runner_updated_at"]);

/** Where `RunContext.persist` reads the record it pre-checks a summary against (see there). */
export type Precheck = "database" | "copy" | AdmissionRecord;

/** Run ids remembered with the last start sent for them on this instance (see `startSentSince`). */
export const STARTS_SENT_REMEMBERED = 10_000;

export class RunContext {
  readonly tokens: ObservationTokens;
  readonly mirrors = new MirrorSet();
  /** Starts in flight by run id: a same-key start, a cancel and reconciliation wait for or skip them. */
  readonly starting = new Map<string, Promise<unknown>>();
  /** Per run id, the `#startSeq` of the last start sent for it here (most recent last). */
  readonly #startsSent = new Map<string, number>();
  #startSeq = 0;
  #closed = false;

  constructor(
    readonly store: StateStore,
    readonly registry: Registry,
    readonly log: Logger,
  ) {
    this.tokens = new ObservationTokens(store.serverSecret);
  }

  get closed(): boolean {
    return this.#closed;
  }

  close(): void {
    this.#closed = true;
    for (const m of this.mirrors.values()) m.touch();
  }

  /** A run.start for `runId` is about to leave on a link of this instance. */
  noteStartSent(runId: string): void {
    this.#startSeq += 1;
    this.#startsSent.delete(runId);
    this.#startsSent.set(runId, this.#startSeq);
    if (this.#startsSent.size > STARTS_SENT_REMEMBERED) {
      const oldest = this.#startsSent.keys().next().value;
      if (oldest !== undefined) this.#startsSent.delete(oldest);
    }
  }

  /** Take before asking the Runner whether it knows a run; see `startSentSince`. */
  startMark(): number {
    return this.#startSeq;
  }

  /**
   * Whether a start of `runId` left on this instance after `mark` was taken: then a `not_found` the
   * Runner gave to a question asked after the mark may predate that start (the start can be admitted,
   * answered and out of `starting` before the record says so — on another instance, the one that
   * forwarded it writes `admitted`), so it proves nothing.
   */
  startSentSince(runId: string, mark: number): boolean {
    return (this.#startsSent.get(runId) ?? 0) > mark;
  }

  /**
   * The principal's own run, or undefined (another principal's run looks exactly like no run). `recent`:
   * read for showing it (StateStore.peek), not for deciding anything.
   */
  async owned(principal: Principal, runId: string, recent = false): Promise<AdmissionRecord | undefined> {
    const rec = recent ? await this.store.peek(runId) : await this.store.get(runId);
    if (!rec || rec.principal_id !== principal.id || !principal.projects.has(rec.project_id)) return undefined;
    return rec;
  }

  /**
   * What a Runner summary may change in `rec`: never a terminal record back to a non-terminal state, and
   * never a live record to a non-terminal summary older than the one it last took. Summaries reach the
   * record by several paths at once (the run's events, a catch-up's or a cancel's answer, the admission
   * answer), so one that left the Runner earlier can be written later: e.g. a cancel's answer saying
   * `waiting_permission` after the event that ended the wait. The Runner's order is its `last_seq`, then
   * its `updated_at` (stamped at every state change). A terminal summary is never stale.
   */
  noRegress(rec: AdmissionRecord, s: RunSummary): RecordPatch {
    if (isTerminalState(rec.state) && !isTerminalState(s.state)) return {};
    if (!isTerminalState(s.state) && summaryBehind(s, rec)) return {};
    return summaryPatch(s);
  }

  /**
   * Take a Runner summary into the record (a `sent` record becomes `admitted`); writes only on change.
   * The record read outside a transaction only says whether anything may change; the patch is decided
   * again on the row read FOR UPDATE in the transaction that writes it, so the no-regress rule holds
   * against a concurrent writer on any instance.
   *
   * `precheck` says where that first record comes from: the database (default), or — for the paths
   * taken on every event (the holder's run.update, an observer's catch-up) — a copy (`"copy"`,
   * StateStore.peek) or the record the caller just read that way. What a summary sets only moves
   * forward, so a copy behind the database sends at most a write that changes nothing into the
   * transaction; a copy ahead of it (read before a restore from an older backup) can leave a
   * non-terminal field behind until the run's next change. A terminal summary is always checked
   * against the database: the run's end is never skipped on the word of a copy.
   */
  async persist(runId: string, summary: RunSummary, precheck: Precheck = "database"): Promise<void> {
    const rec =
      precheck === "database" || isTerminalState(summary.state)
        ? await this.store.get(runId)
        : precheck === "copy"
          ? await this.store.peek(runId)
          : precheck;
    if (!rec || this.#summaryPatch(rec, summary) === null) return;
    await this.store.transaction(async (tx) => {
      const locked = await this.store.lock(tx, runId);
      const patch = locked && this.#summaryPatch(locked, summary);
      if (patch) await this.store.update(runId, patch, { tx });
    });
  }

  /** What `summary` changes in `rec`, or null when nothing. */
  #summaryPatch(rec: AdmissionRecord, summary: RunSummary): RecordPatch | null {
    const patch: RecordPatch = this.noRegress(rec, summary);
    if (rec.admission === "sent") patch.admission = "admitted";
    const same = (a: unknown, b: unknown) => a === b || (Array.isArray(a) && JSON.stringify(a) === JSON.stringify(b));
    // The summary's place in the Runner's order is written along with a change, never alone: one write per
    // event would cost every event a database write, and a summary that changes nothing needs no guarding.
    const changed = (Object.keys(patch) as (keyof RecordPatch)[]).some(
      (k) => !ORDER_ONLY.has(k) && !same((rec as unknown as Record<string, unknown>)[k], patch[k]),
    );
    return changed ? patch : null;
  }

  /**
   * The Runner answered `pruned`: it admitted the run and kept only its tombstone. A record that is not
   * terminal yet takes the tombstone's outcome; a terminal one keeps its richer details (a `sent` one
   * becomes `admitted`). Decided on the row read FOR UPDATE in the transaction that writes it.
   */
  async applyTombstone(runId: string, tombstone: RunTombstone): Promise<void> {
    const mirror = this.mirrors.get(runId);
    if (mirror) mirror.pruned = true;
    const wrote = await this.store.transaction(async (tx) => {
      const rec = await this.store.lock(tx, runId);
      if (!rec || rec.admission === "rejected_pre_admission") return false;
      if (isTerminalState(rec.state)) {
        if (rec.admission === "sent") await this.store.update(runId, { admission: "admitted" }, { tx });
        return false;
      }
      await this.store.update(runId, tombstonePatch(tombstone), { tx });
      return true;
    });
    if (!wrote) return;
    this.log.info({ run_id: runId, state: tombstone.state }, "run known to its Runner only by its tombstone");
    this.mirrors.get(runId)?.touch();
  }

  /**
   * Whether `conn` is still this instance's live link of its Runner and still holds the Runner's lease as
   * the database says it in `tx` (a Runner that resumed on another instance is answered there, where starts
   * this instance cannot see may have been admitted). Asked before a record is closed on a `not_found`.
   */
  async linkHeld(tx: StateQueries, conn: LiveRunner["conn"]): Promise<boolean> {
    const live = this.registry.live(conn.runnerId)?.conn;
    if (live === undefined || live !== conn) return false;
    const holder = (live as RunnerConnection).leaseHolderId;
    return holder !== null && (await leaseHolderIn(tx, conn.runnerId)) === holder;
  }

  /**
   * run.sync / run.cancel answered not_found over the runner's current connection for a record that
   * was sent but whose start has settled: the Runner admits durably before replying and ignores frames
   * from a replaced socket, so the run was never admitted. Decided on the row read FOR UPDATE in the
   * transaction that closes it.
   */
  async closeIfNeverAdmitted(runId: string, runner: LiveRunner, mark: number): Promise<void> {
    const closed = await this.store.transaction(async (tx) => {
      const rec = await this.store.lock(tx, runId);
      if (rec?.admission !== "sent" || isTerminalState(rec.state) || this.starting.has(runId)) return undefined;
      if (this.startSentSince(runId, mark)) return undefined;
      if (!(await this.linkHeld(tx, runner.conn))) return undefined;
      if (rec.store_id !== null && rec.store_id !== runner.storeId) return undefined; // a store change is the hello's to judge
      const d = decideAfterQuery(rec, null);
      if (d.kind !== "close") return undefined;
      return await this.store.update(runId, d.patch, { tx });
    });
    if (!closed) return;
    this.log.info({ run_id: runId, runner_id: closed.runner_id }, "run never admitted by its Runner; closed");
    this.mirrors.get(runId)?.touch();
  }
}
