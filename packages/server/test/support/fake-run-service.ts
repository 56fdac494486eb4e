/**
 * An in-memory RunService for link/hub/run-core unit tests: admits runs with
 * fence checks, lets the test emit events and state changes, and counts
 * start calls. It is NOT the Runner's run manager.
 */
import { randomBytes } from "node:crypto";
import type { RunEvent, RunEventBody, RunState, RunSummary, RunTombstone } from "@webcodex/protocol";
import type {
  HelloBody,
  RunApplyOutcome,
  RunCancelResult,
  RunChangesOutcome,
  RunService,
  RunStartOutcome,
  RunStartRequest,
  RunSyncResult,
  RunUpdateListener,
} from "../../../runner/src/runs/service.js";
import { recoveryUpdateFor } from "../../../runner/src/store/recovery.js";

export function instanceId(): string {
  return randomBytes(12).toString("base64url");
}

interface FakeRun {
  summary: RunSummary;
  events: RunEvent[];
}

export class FakeRunService implements RunService {
  agentInstanceId = instanceId();
  storeId = instanceId();
  providerInstanceId = instanceId();
  projects = [{ project_id: "demo", allow_patch: true }];
  providers = [{ provider_id: "fake", name: "Fake", allowed_config_options: ["model"] }];
  readonly runs = new Map<string, FakeRun>();
  /** Runs "pruned" by the test: answered `pruned` with this tombstone. */
  readonly tombstones = new Map<string, RunTombstone>();
  readonly starts: RunStartRequest[] = [];
  readonly cancels: string[] = [];
  /** While set, a cancel is recorded but answered only once this settles (an answer that may never come). */
  cancelGate: Promise<void> | null = null;
  /** While set, a start is recorded but decided and answered only once this settles. */
  startGate: Promise<void> | null = null;
  capacityFull = false;
  /** Ring size: events older than this many are dropped. */
  ringMax = 10_000;
  readonly #listeners = new Set<RunUpdateListener>();

  constructor(init?: Partial<Pick<FakeRunService, "projects" | "providers">>) {
    if (init?.projects) this.projects = init.projects;
    if (init?.providers) this.providers = init.providers;
  }

  /**
   * A new "process": fresh instance ids, rings emptied, and every non-terminal
   * run settled by the Runner's own recovery table (`recoveryUpdateFor`, keyed
   * on the run's phase) — not a copy of it. Kept as a double because these
   * in-process tests inspect Server state (admission rows, fences) at exact
   * points of a restart; the same restarts against the real Runner process are
   * in link-acceptance.test.ts and crash-matrix-server.test.ts.
   */
  restart(opts: { newStore?: boolean } = {}): void {
    this.agentInstanceId = instanceId();
    this.providerInstanceId = instanceId();
    if (opts.newStore) {
      this.storeId = instanceId();
      this.runs.clear();
    }
    for (const r of this.runs.values()) {
      // The Runner writes a run's last_seq with its terminal row only: a run it settles after a crash
      // comes back with the row's 0, its events uncounted.
      const update = recoveryUpdateFor({ ...r.summary, last_seq: 0 });
      if (update) this.#set(r, { ...update, phase: "terminal" }, false);
      r.events = [];
      r.summary = { ...r.summary, oldest_seq: r.summary.last_seq + 1 };
    }
  }

  helloBody(): HelloBody {
    return {
      agent_instance_id: this.agentInstanceId,
      store_id: this.storeId,
      capabilities: { coding_agent_run: { max_concurrent_runs: 4 } },
      providers: this.providers.map((p) => ({ ...p, provider_instance_id: this.providerInstanceId })),
      projects: this.projects,
    };
  }

  async start(req: RunStartRequest): Promise<RunStartOutcome> {
    this.starts.push(req);
    if (this.startGate !== null) await this.startGate;
    const existing = this.runs.get(req.run_id);
    if (existing) {
      if (existing.summary.intent_fingerprint !== req.intent_fingerprint) {
        return { ok: false, code: "idempotency_conflict", message: "conflict", run: existing.summary };
      }
      return { ok: true, run: existing.summary, created: false };
    }
    const tombstone = this.tombstones.get(req.run_id);
    if (tombstone) return { ok: false, code: "pruned", message: "pruned", tombstone };
    if (req.agent_instance_id !== this.agentInstanceId)
      return { ok: false, code: "stale_runner", message: "stale runner" };
    if (req.provider_instance_id !== this.providerInstanceId) {
      return { ok: false, code: "stale_provider", message: "stale provider" };
    }
    if (this.capacityFull) return { ok: false, code: "capacity", message: "full" };
    const now = new Date().toISOString();
    const summary: RunSummary = {
      run_id: req.run_id,
      intent_fingerprint: req.intent_fingerprint,
      project_id: req.project_id,
      provider_id: req.provider_id,
      provider_instance_id: req.provider_instance_id,
      agent_instance_id: req.agent_instance_id,
      phase: "admitted",
      state: "starting",
      execution_state: "not_started",
      stop_reason: null,
      failure_kind: null,
      recovery_kind: "wait",
      message: null,
      effective_config: [],
      ignored_updates: 0,
      last_seq: 0,
      oldest_seq: 1,
      created_at: now,
      updated_at: now,
    };
    this.runs.set(req.run_id, { summary, events: [] });
    return { ok: true, run: summary, created: true };
  }

  sync(runId: string, afterSeq: number, maxEvents: number): RunSyncResult | null {
    const r = this.runs.get(runId);
    if (!r) return null;
    const after = r.events.filter((e) => e.seq > afterSeq);
    return { run: r.summary, events: after.slice(0, maxEvents), has_more: after.length > maxEvents };
  }

  tombstone(runId: string): RunTombstone | null {
    return this.runs.has(runId) ? null : (this.tombstones.get(runId) ?? null);
  }

  /** No run of this fake has a workspace. */
  async changes(runId: string): Promise<RunChangesOutcome | null> {
    if (!this.runs.has(runId)) return null;
    return { ok: false, code: "invalid_request", message: "no workspace" };
  }

  /** No run of this fake has a workspace. */
  async apply(runId: string): Promise<RunApplyOutcome | null> {
    if (!this.runs.has(runId)) return null;
    return { ok: false, refusal: { reason: "shared_project" } };
  }

  async cancel(runId: string): Promise<RunCancelResult | null> {
    const r = this.runs.get(runId);
    if (!r) return null;
    this.cancels.push(runId);
    if (this.cancelGate !== null) await this.cancelGate;
    const terminal = ["completed", "failed", "cancelled", "lost"].includes(r.summary.state);
    return { run: r.summary, cancel_requested: !terminal, already_terminal: terminal };
  }

  inventory(): RunSummary[] {
    return [...this.runs.values()].map((r) => r.summary);
  }

  onUpdate(listener: RunUpdateListener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  async close(): Promise<void> {}

  // ---- test controls ----

  #set(r: FakeRun, patch: Partial<RunSummary>, push = true): void {
    r.summary = { ...r.summary, ...patch, updated_at: new Date().toISOString() };
    if (push) for (const l of this.#listeners) l(r.summary, []);
  }

  setState(runId: string, state: RunState, extra: Partial<RunSummary> = {}): void {
    const r = this.runs.get(runId);
    if (!r) throw new Error("no run");
    this.#set(r, { state, ...extra });
  }

  /** Append events and push them (unless `silent`, which simulates a dropped update). */
  emit(runId: string, bodies: RunEventBody[], opts: { silent?: boolean } = {}): RunEvent[] {
    const r = this.runs.get(runId);
    if (!r) throw new Error("no run");
    const out: RunEvent[] = [];
    for (const b of bodies) {
      const e = { ...b, seq: r.summary.last_seq + 1, at: new Date().toISOString() } as RunEvent;
      r.events.push(e);
      out.push(e);
      r.summary = { ...r.summary, last_seq: e.seq };
    }
    while (r.events.length > this.ringMax) r.events.shift();
    r.summary = { ...r.summary, oldest_seq: r.events[0]?.seq ?? r.summary.last_seq + 1 };
    if (!opts.silent) for (const l of this.#listeners) l(r.summary, out);
    return out;
  }

  finish(runId: string, state: "completed" | "cancelled" | "failed" = "completed"): void {
    const r = this.runs.get(runId);
    if (!r) throw new Error("no run");
    const stop = state === "completed" ? "end_turn" : state === "cancelled" ? "cancelled" : null;
    r.summary = {
      ...r.summary,
      state,
      execution_state: "completed",
      stop_reason: stop,
      recovery_kind: "none",
      phase: "terminal",
    };
    this.emit(runId, [
      { kind: "terminal", state, execution_state: "completed", stop_reason: stop, failure_kind: null, message: "done" },
    ]);
  }
}

export function msg(text: string): RunEventBody {
  return { kind: "agent_message", text, truncated: false };
}
