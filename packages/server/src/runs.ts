/**
 * The Server's run core: implements RunsApi (admission in the exact order of
 * DESIGN §6.1, observe, cancel, project listing) and listens to the Runner
 * hub (hello → registry + reconciliation, run.update → mirrors + records).
 */
import {
  ConfigMap,
  type FailureKind,
  type HelloFrame,
  isTerminalState,
  MAX_EVENTS_PER_OBSERVE,
  MAX_EVENTS_PER_SYNC,
  MAX_OBSERVE_WAIT_SECS,
  MAX_PROMPT_BYTES,
  MAX_RUN_TIMEOUT_SECS,
  MIN_RUN_TIMEOUT_SECS,
  OBSERVE_OUTPUT_BUDGET_BYTES,
  ProjectId,
  ProviderId,
  type RecoveryKind,
  RunId,
  type RunnerErrorCode,
  type RunSummary,
  type RunUpdateFrame,
  utf8Length,
} from "@webcodex/protocol";
import type { Logger } from "pino";
import { deriveRunId, intentFingerprint } from "./identity.js";
import { MAX_OBSERVATION_TOKEN_LENGTH, ObservationTokens } from "./observe-token.js";
import { decideAfterQuery, type ReconcileDeps, reconcileRecord, reconcileRunner } from "./reconcile.js";
import type { LiveRunner, Registry } from "./registry.js";
import { MirrorSet, type RunMirror } from "./run-mirror.js";
import type { HubListener, RequestOutcome, RunnerConnection } from "./runner-hub.js";
import type {
  ApiErrorCode,
  ApiResult,
  CancelOutput,
  ObserveInput,
  ObserveOutput,
  Principal,
  ProjectView,
  RunsApi,
  StartInput,
  StartOutput,
} from "./runs-api.js";
import type { AdmissionRecord, RecordPatch, StateStore } from "./state-store.js";

const MAX_IDEMPOTENCY_KEY_BYTES = 256;
const MAX_WORKFLOW_SESSION_ID_LENGTH = 128;
const MAX_SYNC_ROUNDS = 32;
const SYNC_TIMEOUT_MS = 10_000;
/** An observe waits at least this long for a catch-up before answering from the mirror as it is. */
const CATCH_UP_MIN_WAIT_MS = 2_000;

function withTimeout(p: Promise<void>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([p, new Promise<void>((r) => (timer = setTimeout(r, ms)))]).finally(() => clearTimeout(timer));
}

function fail<T>(code: ApiErrorCode, message: string, recovery_kind: RecoveryKind): ApiResult<T> {
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
  };
}

/** Both the Server's own check and the Runner's rejection say the same: it is the operator's setting. */
const PROJECT_NOT_WRITABLE_MESSAGE =
  "The project's Runner does not allow patches; nothing was started. An operator must set allow_patch = true for this project in the Runner's config.";

/** Pre-admission Runner rejections: API code, failure kind for the record, recovery. */
const RUNNER_REJECTIONS: Partial<
  Record<RunnerErrorCode, { code: ApiErrorCode; failure: FailureKind; recovery: RecoveryKind; message: string }>
> = {
  stale_runner: {
    code: "stale_provider",
    failure: "stale_provider",
    recovery: "retry_same",
    message:
      "The Runner restarted between routing and dispatch; nothing was started. Retry with the same idempotency key.",
  },
  stale_provider: {
    code: "stale_provider",
    failure: "stale_provider",
    recovery: "retry_same",
    message:
      "The provider restarted between routing and dispatch; nothing was started. Retry with the same idempotency key.",
  },
  capacity: {
    code: "capacity",
    failure: "capacity",
    recovery: "retry_same",
    message: "The Runner is running as many runs as it allows; nothing was started. Retry with the same key later.",
  },
  unknown_project: {
    code: "runner_unavailable",
    failure: "never_admitted",
    recovery: "retry_same",
    message: "The Runner does not serve this project right now; nothing was started.",
  },
  project_not_writable: {
    code: "forbidden",
    failure: "never_admitted",
    recovery: "none",
    message: PROJECT_NOT_WRITABLE_MESSAGE,
  },
  unknown_provider: {
    code: "provider_unavailable",
    failure: "never_admitted",
    recovery: "retry_same",
    message: "The Runner does not offer this provider right now; nothing was started.",
  },
  invalid_request: {
    code: "invalid_input",
    failure: "never_admitted",
    recovery: "fix_input",
    message: "The Runner rejected the run request as invalid; nothing was started.",
  },
};

export interface RunsOptions {
  store: StateStore;
  registry: Registry;
  logger: Logger;
  /** Test-only: pause between resolve and run.start (WEBCODEX_TEST_HOOK_DELAY_AFTER_RESOLVE_MS). */
  testDelayAfterResolveMs?: number;
  startTimeoutMs?: number;
}

export class Runs implements RunsApi, HubListener {
  readonly tokens: ObservationTokens;
  readonly mirrors = new MirrorSet();
  readonly #store: StateStore;
  readonly #registry: Registry;
  readonly #log: Logger;
  readonly #starting = new Map<string, Promise<unknown>>();
  /** Runs whose cancel was sent but whose delivery is unknown (connection closed or request timed out). */
  readonly #pendingCancels = new Set<string>();
  readonly #delayMs: number;
  readonly #startTimeoutMs: number;
  #closed = false;

  constructor(opts: RunsOptions) {
    this.#store = opts.store;
    this.#registry = opts.registry;
    this.#log = opts.logger;
    this.tokens = new ObservationTokens(opts.store.serverSecret);
    this.#delayMs = opts.testDelayAfterResolveMs ?? 0;
    this.#startTimeoutMs = opts.startTimeoutMs ?? 30_000;
  }

  close(): void {
    this.#closed = true;
    for (const m of this.mirrors.values()) m.touch();
  }

  // ---- start ----------------------------------------------------------------

  async start(principal: Principal, input: StartInput): Promise<ApiResult<StartOutput>> {
    // 1. authenticate: done by the front end (principal). 2. validate input.
    const invalid = validateStart(input);
    if (invalid) return fail("invalid_input", invalid, "fix_input");
    // 3. scopes and exact project grant.
    if (!principal.scopes.has("coding_agent:run") || !principal.scopes.has("project:write")) {
      return fail("forbidden", "Starting a coding agent needs the coding_agent:run and project:write scopes.", "none");
    }
    if (!principal.projects.has(input.project_id)) {
      return fail("forbidden", `No grant on project ${input.project_id}.`, "none");
    }
    // 4. derive run_id.
    const runId = deriveRunId(this.#store.serverSecret, principal.id, input.idempotency_key);
    const fingerprint = intentFingerprint({
      project_id: input.project_id,
      provider_id: input.provider_id,
      prompt: input.prompt,
      config: input.config ?? {},
      timeout_secs: input.timeout_secs ?? null,
    });
    // Same key in flight: wait for it, then meet its record.
    for (let i = 0; i < 10; i++) {
      const inflight = this.#starting.get(runId);
      if (!inflight) break;
      await inflight.catch(() => undefined);
    }
    if (this.#starting.has(runId)) return fail("capacity", "This run is still being started; observe it.", "wait");
    const work = this.#startLocked(principal, input, runId, fingerprint);
    this.#starting.set(runId, work);
    try {
      return await work;
    } finally {
      if (this.#starting.get(runId) === work) this.#starting.delete(runId);
      // A start whose outcome is unknown: a hello that arrived meanwhile skipped it as busy, and a
      // timeout on a live link brings no hello at all. Settle it now against the current connection.
      if (this.#store.get(runId)?.admission === "sent") void this.#reconcileOne(runId);
    }
  }

  /** Single-record reconciliation over the runner's current connection (run.sync decides). */
  async #reconcileOne(runId: string): Promise<void> {
    const rec = this.#store.get(runId);
    const runner = rec && this.#registry.live(rec.runner_id);
    const hello = runner?.conn.hello;
    if (!rec || !runner || !hello || this.#closed) return; // offline: the next hello reconciles it
    try {
      // An empty inventory forces a fresh run.sync query instead of trusting the hello's snapshot.
      await reconcileRecord(rec, { ...hello, inventory: [] }, this.#reconcileDeps(runner.conn, runner));
    } catch (err) {
      this.#log.error({ run_id: runId, err: (err as Error).message }, "single-run reconciliation failed");
    }
  }

  /**
   * run.sync / run.cancel answered not_found over the runner's current connection for a record that
   * was sent but whose start has settled: the Runner admits durably before replying and ignores frames
   * from a replaced socket, so the run was never admitted.
   */
  #closeIfNeverAdmitted(runId: string, runner: LiveRunner): void {
    const rec = this.#store.get(runId);
    if (rec?.admission !== "sent" || isTerminalState(rec.state) || this.#starting.has(runId)) return;
    if (this.#registry.live(rec.runner_id)?.conn !== runner.conn) return;
    if (rec.store_id !== null && rec.store_id !== runner.storeId) return; // a store change is the hello's to judge
    const d = decideAfterQuery(rec, null);
    if (d.kind !== "close") return;
    this.#store.update(runId, d.patch);
    this.#log.info({ run_id: runId, runner_id: rec.runner_id }, "run never admitted by its Runner; closed");
    this.mirrors.get(runId)?.touch();
  }

  async #startLocked(
    principal: Principal,
    input: StartInput,
    runId: string,
    fingerprint: string,
  ): Promise<ApiResult<StartOutput>> {
    // 5. existing record?
    const existing = this.#store.get(runId);
    if (existing) {
      if (existing.intent_fingerprint !== fingerprint) {
        return fail(
          "idempotency_conflict",
          "This idempotency key was already used for a different request; use a new key or repeat the original request.",
          "fix_input",
        );
      }
      if (existing.admission !== "rejected_pre_admission") {
        this.#log.info({ run_id: runId, principal_id: principal.id }, "start replayed");
        return {
          ok: true,
          value: {
            run_id: runId,
            state: existing.state,
            execution_state: existing.execution_state,
            replayed: true,
            observation_token: this.#freshToken(existing),
          },
        };
      }
      // A pre-admission rejection: an exact retry may re-admit (retry_same).
    }
    // 6. resolve project -> runner -> provider, capturing both instance ids.
    const res = this.#registry.resolveProject(input.project_id);
    const runnerId =
      res.kind === "unknown_project" ? undefined : res.kind === "runner_offline" ? res.runnerId : res.runner.runnerId;
    if (res.kind === "unknown_project" || runnerId === undefined) {
      return fail("not_found", `Project ${input.project_id} is not configured on this Server.`, "fix_input");
    }
    if (res.kind === "runner_offline") {
      this.#recordRejection(existing, principal, input, runId, fingerprint, runnerId, "never_admitted");
      return fail(
        "runner_unavailable",
        "The project's Runner is offline; nothing was started. Retry with the same key.",
        "retry_same",
      );
    }
    if (res.kind === "not_advertised") {
      return fail("runner_unavailable", "The project's Runner does not serve this project right now.", "wait");
    }
    const { runner, project } = res;
    const provider = runner.providers.find((p) => p.provider_id === input.provider_id);
    if (!provider) {
      const offered = runner.providers.map((p) => `${p.provider_id} (${p.name})`).join(", ") || "none";
      return fail(
        "provider_unavailable",
        `Unknown provider ${input.provider_id} for project ${input.project_id}. Available providers: ${offered}.`,
        "fix_input",
      );
    }
    if (!project.allow_patch) return fail("forbidden", PROJECT_NOT_WRITABLE_MESSAGE, "none");
    const fences = {
      agent_instance_id: runner.agentInstanceId,
      provider_instance_id: provider.provider_instance_id,
      store_id: runner.storeId,
    };
    // 7. durably record the admission intent.
    const intent = {
      project_id: input.project_id,
      provider_id: input.provider_id,
      runner_id: runner.runnerId,
      intent_fingerprint: fingerprint,
      ...fences,
      admission: "intent_recorded" as const,
      state: "starting" as const,
      execution_state: "not_started" as const,
      stop_reason: null,
      failure_kind: null,
      recovery_kind: "wait" as const,
      message: null,
    };
    if (existing) this.#store.update(runId, { ...intent, cancel_forwarded: false });
    else this.#store.insert({ run_id: runId, principal_id: principal.id, ...intent });
    if (this.#delayMs > 0) {
      this.#log.warn({ run_id: runId, ms: this.#delayMs }, "TEST HOOK: delaying between resolve and run.start");
      await new Promise((r) => setTimeout(r, this.#delayMs));
    }
    // 8. send run.start with the captured fences, over the runner's current connection.
    const conn = this.#registry.live(runner.runnerId)?.conn;
    if (!conn) {
      this.#store.update(
        runId,
        this.#rejectionPatch(
          "never_admitted",
          "The project's Runner went offline before dispatch; nothing was started.",
        ),
      );
      return fail(
        "runner_unavailable",
        "The project's Runner went offline before dispatch; nothing was started. Retry with the same key.",
        "retry_same",
      );
    }
    this.#store.update(runId, { admission: "sent" });
    const outcome = await conn.request(
      {
        type: "run.start",
        run_id: runId,
        intent_fingerprint: fingerprint,
        project_id: input.project_id,
        provider_id: input.provider_id,
        agent_instance_id: fences.agent_instance_id,
        provider_instance_id: fences.provider_instance_id,
        prompt: input.prompt,
        config: input.config ?? {},
        timeout_secs: input.timeout_secs ?? null,
      },
      this.#startTimeoutMs,
    );
    if (!outcome.ok) {
      if (outcome.reason === "busy" || outcome.reason === "not_sent") {
        this.#store.update(
          runId,
          this.#rejectionPatch("never_admitted", "The Runner link was busy; nothing was started."),
        );
        return fail(
          "runner_unavailable",
          "The Runner link is busy; nothing was started. Retry with the same key.",
          "retry_same",
        );
      }
      // The frame may have reached the Runner: the outcome is unknown. Reconciliation settles it.
      this.#log.warn({ run_id: runId, reason: outcome.reason }, "run.start outcome unknown; left for reconciliation");
      const rec = this.#store.get(runId);
      return {
        ok: true,
        value: {
          run_id: runId,
          state: rec?.state ?? "starting",
          execution_state: rec?.execution_state ?? "not_started",
          replayed: false,
          observation_token: this.tokens.issue({ run_id: runId, instance: fences.agent_instance_id, seq: 0 }),
        },
      };
    }
    const frame = outcome.frame;
    if (frame.type === "run.start.result") {
      const rec = this.#store.get(runId);
      let latest = rec;
      if (rec && rec.admission !== "admitted") {
        latest = this.#store.update(runId, { admission: "admitted", ...this.#noRegress(rec, frame.run) });
      }
      const mirror = this.mirrors.getOrCreate(runId);
      if (mirror.instance !== runner.agentInstanceId) mirror.reset(runner.agentInstanceId);
      if (!mirror.synced && mirror.size === 0 && mirror.lastSeq === 0 && frame.run.last_seq === 0)
        mirror.markSynced(frame.run);
      else void this.#catchUp(mirror, runner);
      this.#log.info({ run_id: runId, runner_id: runner.runnerId, created: frame.created }, "run admitted");
      return {
        ok: true,
        value: {
          run_id: runId,
          state: latest?.state ?? frame.run.state,
          execution_state: latest?.execution_state ?? frame.run.execution_state,
          replayed: !frame.created,
          observation_token: this.tokens.issue({ run_id: runId, instance: runner.agentInstanceId, seq: 0 }),
        },
      };
    }
    if (frame.type === "error") {
      const rej = RUNNER_REJECTIONS[frame.code];
      if (rej) {
        this.#store.update(runId, this.#rejectionPatch(rej.failure, rej.message, rej.recovery));
        this.#log.info({ run_id: runId, code: frame.code }, "run rejected by the Runner before admission");
        return fail(rej.code, rej.message, rej.recovery);
      }
      this.#log.warn({ run_id: runId, code: frame.code }, "run.start answered with an unexpected error");
      if (frame.code === "idempotency_conflict") {
        return fail("idempotency_conflict", "The Runner holds a different run under this id.", "reconcile");
      }
      return fail("internal", "The Runner could not start the run; its outcome is being reconciled.", "reconcile");
    }
    return fail("internal", "Unexpected Runner response.", "reconcile");
  }

  #rejectionPatch(failure: FailureKind, message: string, recovery: RecoveryKind = "retry_same"): RecordPatch {
    return {
      admission: "rejected_pre_admission",
      state: "failed",
      execution_state: "not_started",
      stop_reason: null,
      failure_kind: failure,
      recovery_kind: recovery,
      message,
    };
  }

  #recordRejection(
    existing: AdmissionRecord | undefined,
    principal: Principal,
    input: StartInput,
    runId: string,
    fingerprint: string,
    runnerId: string,
    failure: FailureKind,
  ): void {
    const patch = this.#rejectionPatch(failure, "The project's Runner was offline; nothing was started.");
    if (existing) {
      this.#store.update(runId, patch);
      return;
    }
    this.#store.insert({
      run_id: runId,
      principal_id: principal.id,
      project_id: input.project_id,
      provider_id: input.provider_id,
      runner_id: runnerId,
      intent_fingerprint: fingerprint,
      agent_instance_id: null,
      provider_instance_id: null,
      store_id: null,
      admission: "rejected_pre_admission",
      state: "failed",
      execution_state: "not_started",
      stop_reason: null,
      failure_kind: failure,
      recovery_kind: "retry_same",
      message: patch.message ?? null,
    });
  }

  /** Never move a terminal record back to a non-terminal state. */
  #noRegress(rec: AdmissionRecord, s: RunSummary): RecordPatch {
    if (isTerminalState(rec.state) && !isTerminalState(s.state)) return {};
    return summaryPatch(s);
  }

  #freshToken(rec: AdmissionRecord): string {
    const mirror = this.mirrors.get(rec.run_id);
    const instance =
      mirror?.instance ??
      this.#registry.live(rec.runner_id)?.agentInstanceId ??
      rec.agent_instance_id ??
      "no_runner_instance";
    return this.tokens.issue({ run_id: rec.run_id, instance, seq: 0 });
  }

  // ---- observe --------------------------------------------------------------

  #owned(principal: Principal, runId: string): AdmissionRecord | undefined {
    const rec = this.#store.get(runId);
    if (!rec || rec.principal_id !== principal.id || !principal.projects.has(rec.project_id)) return undefined;
    return rec;
  }

  async observe(principal: Principal, input: ObserveInput, signal?: AbortSignal): Promise<ApiResult<ObserveOutput>> {
    if (!RunId.safeParse(input.run_id).success) return fail("invalid_input", "run_id is not a run id.", "fix_input");
    if (input.wait_secs !== undefined && (typeof input.wait_secs !== "number" || !(input.wait_secs >= 0))) {
      return fail("invalid_input", "wait_secs must be a number of seconds >= 0.", "fix_input");
    }
    if (!principal.scopes.has("coding_agent:run")) {
      return fail("forbidden", "Observing a coding agent needs the coding_agent:run scope.", "none");
    }
    const rec = this.#owned(principal, input.run_id);
    if (!rec) return fail("not_found", `No run ${input.run_id}.`, "none");
    let cursor = null;
    if (input.after_observation_token !== undefined) {
      cursor = this.tokens.verify(rec.run_id, input.after_observation_token);
      if (!cursor) {
        return fail("invalid_observation_token", "The observation token is not valid for this run.", "reobserve");
      }
    }
    const waitMs = Math.min(input.wait_secs ?? 0, MAX_OBSERVE_WAIT_SECS) * 1000;
    const deadline = Date.now() + waitMs;
    let firstState: string | null = null;
    for (;;) {
      if (this.#closed) return fail("internal", "The Server is shutting down; observe again shortly.", "reobserve");
      const mirror = this.mirrors.getOrCreate(rec.run_id);
      const runner = this.#registry.live(rec.runner_id);
      const admission = this.#store.get(rec.run_id)?.admission;
      if (runner && (admission === "admitted" || admission === "sent")) {
        if (mirror.instance !== runner.agentInstanceId) mirror.reset(runner.agentInstanceId);
        const behind = mirror.summary !== null && mirror.summary.last_seq > mirror.lastSeq;
        if (!mirror.synced || mirror.syncing || behind) {
          // A slow Runner must not hold an observe past its own wait: answer with what is held (has_more).
          await withTimeout(this.#catchUp(mirror, runner), Math.max(CATCH_UP_MIN_WAIT_MS, deadline - Date.now()));
        }
      }
      if (this.#closed) return fail("internal", "The Server is shutting down; observe again shortly.", "reobserve");
      const version = mirror.version;
      const view = this.#view(rec.run_id, mirror, cursor, runner === undefined);
      if (!view) return fail("not_found", `No run ${input.run_id}.`, "none");
      // Anything that changes what the caller sees ends the wait: events, state, the Runner going on/offline.
      const shape = `${view.state}|${view.runner_offline === true}`;
      firstState ??= shape;
      const remaining = deadline - Date.now();
      const nothingNew =
        view.events.length === 0 && !view.history_lost && !isTerminalState(view.state) && shape === firstState;
      if (!nothingNew || cursor === null || remaining <= 0 || signal?.aborted || this.#closed) {
        return { ok: true, value: view };
      }
      await mirror.waitForChange(version, remaining, signal);
    }
  }

  #view(
    runId: string,
    mirror: RunMirror,
    cursor: { instance: string; seq: number } | null,
    runnerOffline: boolean,
  ): ObserveOutput | null {
    const rec = this.#store.get(runId);
    if (!rec) return null;
    const instance = mirror.instance ?? rec.agent_instance_id ?? "no_runner_instance";
    let after: number;
    let historyLost = false;
    if (cursor === null) after = mirror.firstSeq - 1;
    else if (cursor.instance !== instance) {
      historyLost = true;
      after = mirror.firstSeq - 1;
    } else if (cursor.seq + 1 < mirror.firstSeq) {
      historyLost = true;
      after = mirror.firstSeq - 1;
    } else after = cursor.seq;
    const out: ObserveOutput = {
      run_id: runId,
      state: rec.state,
      execution_state: rec.execution_state,
      recovery_kind: rec.recovery_kind,
      events: [],
      observation_token: "",
      history_lost: historyLost,
      has_more: false,
    };
    if (rec.stop_reason !== null) out.stop_reason = rec.stop_reason;
    if (rec.failure_kind !== null) out.failure_kind = rec.failure_kind;
    if (rec.message !== null) out.message = rec.message;
    if (runnerOffline && !isTerminalState(rec.state)) out.runner_offline = true;
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
    out.observation_token = this.tokens.issue({ run_id: runId, instance, seq: lastSeq });
    return out;
  }

  /** Bring a mirror up to the Runner's ring with run.sync(after_seq); one catch-up per mirror at a time. */
  #catchUp(mirror: RunMirror, runner: LiveRunner): Promise<void> {
    if (mirror.syncing) return mirror.syncing;
    const p = (async () => {
      for (let round = 0; round < MAX_SYNC_ROUNDS && !this.#closed; round++) {
        if (runner.conn.closed || mirror.instance !== runner.agentInstanceId) return;
        const after = mirror.lastSeq;
        const res = await runner.conn.request(
          { type: "run.sync", run_id: mirror.runId, after_seq: after, max_events: MAX_EVENTS_PER_SYNC },
          SYNC_TIMEOUT_MS,
        );
        if (!res.ok) return;
        if (mirror.instance !== runner.agentInstanceId) return;
        if (res.frame.type === "error") {
          if (res.frame.code === "not_found") {
            mirror.synced = true;
            this.#closeIfNeverAdmitted(mirror.runId, runner);
          }
          mirror.touch();
          return;
        }
        if (res.frame.type !== "run.sync.result") return;
        const more = mirror.applySync(after, res.frame.run, res.frame.events, res.frame.has_more);
        this.#persist(mirror.runId, res.frame.run);
        const behind = mirror.summary !== null && mirror.summary.last_seq > mirror.lastSeq;
        if (!more && !behind) return;
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

  #persist(runId: string, summary: RunSummary, known?: AdmissionRecord): void {
    const rec = known ?? this.#store.get(runId);
    if (!rec) return;
    const patch: RecordPatch = this.#noRegress(rec, summary);
    if (rec.admission === "sent") patch.admission = "admitted";
    const changed = (Object.keys(patch) as (keyof RecordPatch)[]).some(
      (k) => (rec as unknown as Record<string, unknown>)[k] !== patch[k],
    );
    if (changed) this.#store.update(runId, patch);
  }

  // ---- cancel ---------------------------------------------------------------

  async cancel(principal: Principal, input: { run_id: string }): Promise<ApiResult<CancelOutput>> {
    if (!RunId.safeParse(input.run_id).success) return fail("invalid_input", "run_id is not a run id.", "fix_input");
    if (!principal.scopes.has("coding_agent:run")) {
      return fail("forbidden", "Cancelling a coding agent needs the coding_agent:run scope.", "none");
    }
    let rec = this.#owned(principal, input.run_id);
    if (!rec) return fail("not_found", `No run ${input.run_id}.`, "none");
    const inflight = this.#starting.get(rec.run_id);
    if (inflight) {
      await inflight.catch(() => undefined);
      rec = this.#store.get(rec.run_id) ?? rec;
    }
    if (isTerminalState(rec.state)) {
      return {
        ok: true,
        value: { run_id: rec.run_id, state: rec.state, cancel_requested: false, already_terminal: true },
      };
    }
    if (rec.cancel_forwarded) {
      return {
        ok: true,
        value: { run_id: rec.run_id, state: rec.state, cancel_requested: true, already_terminal: false },
      };
    }
    const runner = this.#registry.live(rec.runner_id);
    if (!runner) {
      return fail(
        "runner_unavailable",
        "The run's Runner is offline; the cancel was not delivered. Try again later.",
        "wait",
      );
    }
    const wasPending = this.#pendingCancels.has(rec.run_id);
    const res = await this.#sendCancel(rec.run_id, runner);
    if (!res.ok && (res.reason === "not_sent" || res.reason === "busy")) {
      if (!wasPending) this.#pendingCancels.delete(rec.run_id);
      return fail("runner_unavailable", "The cancel could not be delivered to the Runner. Try again.", "wait");
    }
    if (res.ok && res.frame.type === "run.cancel.result") {
      const latest = this.#store.get(rec.run_id) ?? rec;
      this.#log.info({ run_id: rec.run_id }, "cancel forwarded");
      return {
        ok: true,
        value: {
          run_id: rec.run_id,
          state: latest.state,
          cancel_requested: res.frame.cancel_requested || !res.frame.already_terminal,
          already_terminal: res.frame.already_terminal,
        },
      };
    }
    const latest = this.#store.get(rec.run_id) ?? rec;
    if (isTerminalState(latest.state)) {
      // E.g. not_found settled it as never admitted: there is nothing left to cancel.
      return {
        ok: true,
        value: { run_id: rec.run_id, state: latest.state, cancel_requested: false, already_terminal: true },
      };
    }
    return {
      ok: true,
      value: { run_id: rec.run_id, state: latest.state, cancel_requested: true, already_terminal: false },
    };
  }

  /**
   * Send run.cancel and record what is known. cancel_forwarded is set only on run.cancel.result; a
   * cancel whose delivery is unknown (closed, timeout) stays pending and is sent again after the
   * runner's next hello — safe, because the Runner sends session/cancel at most once per run.
   */
  async #sendCancel(runId: string, runner: LiveRunner): Promise<RequestOutcome> {
    this.#pendingCancels.add(runId);
    const res = await runner.conn.request({ type: "run.cancel", run_id: runId });
    if (!res.ok) return res;
    this.#pendingCancels.delete(runId);
    if (res.frame.type === "run.cancel.result") {
      this.#store.update(runId, { cancel_forwarded: true });
      this.#persist(runId, res.frame.run);
    } else if (res.frame.type === "error" && res.frame.code === "not_found") {
      this.#closeIfNeverAdmitted(runId, runner);
    }
    return res;
  }

  /** After a hello (and its reconciliation): send again the cancels of this runner whose delivery is unknown. */
  #reforwardCancels(conn: RunnerConnection): void {
    for (const runId of [...this.#pendingCancels]) {
      const rec = this.#store.get(runId);
      if (!rec || rec.cancel_forwarded || isTerminalState(rec.state)) {
        this.#pendingCancels.delete(runId);
        continue;
      }
      const runner = this.#registry.live(rec.runner_id);
      if (rec.runner_id !== conn.runnerId || runner?.conn !== conn) continue;
      this.#log.info({ run_id: runId, runner_id: rec.runner_id }, "re-forwarding a cancel whose delivery was unknown");
      this.#sendCancel(runId, runner).catch((err: unknown) =>
        this.#log.error({ run_id: runId, err: (err as Error).message }, "re-forwarding a cancel failed"),
      );
    }
  }

  // ---- projects -------------------------------------------------------------

  listProjects(principal: Principal): ProjectView[] {
    if (!principal.scopes.has("project:read") && !principal.scopes.has("coding_agent:run")) return [];
    const out: ProjectView[] = [];
    for (const projectId of [...principal.projects].sort()) {
      const runnerId = this.#registry.runnerForProject(projectId);
      if (runnerId === undefined) continue;
      const runner = this.#registry.live(runnerId);
      const advert = runner?.projects.find((p) => p.project_id === projectId);
      out.push({
        project_id: projectId,
        runner_online: runner !== undefined && advert !== undefined,
        allow_patch: advert?.allow_patch ?? false,
        providers:
          runner && advert
            ? runner.providers.map((p) => ({
                provider_id: p.provider_id,
                name: p.name,
                allowed_config_options: [...p.allowed_config_options],
              }))
            : [],
      });
    }
    return out;
  }

  // ---- hub listener -----------------------------------------------------------

  onHello(conn: RunnerConnection, hello: HelloFrame): void {
    if (this.#closed) return;
    const runner = this.#registry.connected(conn, hello);
    for (const m of this.mirrors.values()) {
      if (m.instance !== null && this.#store.get(m.runId)?.runner_id === conn.runnerId) {
        if (m.instance !== hello.agent_instance_id) m.reset(hello.agent_instance_id);
        else m.synced = false; // updates may have been missed while disconnected
        m.touch();
      }
    }
    void reconcileRunner(conn.runnerId, hello, this.#reconcileDeps(conn, runner))
      .catch((err: unknown) => this.#log.error({ err: (err as Error).message }, "reconciliation failed"))
      .then(() => {
        if (!this.#closed) this.#reforwardCancels(conn);
      });
  }

  #reconcileDeps(conn: RunnerConnection, runner: LiveRunner): ReconcileDeps {
    return {
      store: this.#store,
      logger: this.#log,
      isBusy: (runId) => this.#starting.has(runId),
      query: async (runId) => {
        const res = await conn.request({ type: "run.sync", run_id: runId, after_seq: 0, max_events: 0 });
        if (!res.ok) return "unavailable";
        if (res.frame.type === "run.sync.result") return res.frame.run;
        if (res.frame.type === "error" && res.frame.code === "not_found") return null;
        return "unavailable";
      },
      apply: (record, summary) => {
        this.#persist(record.run_id, summary);
        const m = this.mirrors.get(record.run_id);
        if (m) {
          if (m.instance !== runner.agentInstanceId) m.reset(runner.agentInstanceId);
          if (m.applyUpdate(summary, [])) void this.#catchUp(m, runner);
        }
      },
      closed: (record) => this.mirrors.get(record.run_id)?.touch(),
    };
  }

  onUpdate(conn: RunnerConnection, frame: RunUpdateFrame): void {
    if (this.#closed) return;
    const runId = frame.run.run_id;
    const rec = this.#store.get(runId);
    const runner = this.#registry.live(conn.runnerId);
    if (!rec || rec.runner_id !== conn.runnerId || !runner || runner.conn !== conn) {
      this.#log.debug(
        { run_id: runId, runner_id: conn.runnerId },
        "run.update for a run this runner does not hold; ignored",
      );
      return;
    }
    if (rec.admission === "rejected_pre_admission") return;
    this.#persist(runId, frame.run, rec);
    const mirror = this.mirrors.getOrCreate(runId);
    if (mirror.instance !== runner.agentInstanceId) mirror.reset(runner.agentInstanceId);
    if (mirror.applyUpdate(frame.run, frame.events)) void this.#catchUp(mirror, runner);
  }

  onDisconnect(conn: RunnerConnection): void {
    if (this.#closed) return;
    this.#registry.disconnected(conn);
    for (const m of this.mirrors.values()) {
      if (this.#store.get(m.runId)?.runner_id === conn.runnerId) m.touch();
    }
  }
}

/** Input validation of start_coding_agent (closed set of fields is the front end's job; values are checked here). */
export function validateStart(input: StartInput): string | null {
  if (!ProjectId.safeParse(input.project_id).success) return "project_id must match ^[a-z0-9][a-z0-9_-]{0,63}$.";
  if (!ProviderId.safeParse(input.provider_id).success) return "provider_id must match ^[a-z0-9][a-z0-9_-]{0,63}$.";
  const key = input.idempotency_key;
  if (typeof key !== "string" || key.length === 0 || utf8Length(key) > MAX_IDEMPOTENCY_KEY_BYTES) {
    return `idempotency_key must be 1-${MAX_IDEMPOTENCY_KEY_BYTES} bytes.`;
  }
  // biome-ignore lint/suspicious/noControlCharactersInRegex: rejecting control characters is the point
  if (/[\u0000-\u001f\u007f]/.test(key)) return "idempotency_key must not contain control characters.";
  if (typeof input.prompt !== "string" || input.prompt.length === 0) return "prompt must not be empty.";
  if (utf8Length(input.prompt) > MAX_PROMPT_BYTES) return `prompt must be at most ${MAX_PROMPT_BYTES} bytes.`;
  if (input.config !== undefined && !ConfigMap.safeParse(input.config).success) {
    return "config must map option ids to string or boolean values (at most 32 entries).";
  }
  if (
    input.timeout_secs !== undefined &&
    (!Number.isInteger(input.timeout_secs) ||
      input.timeout_secs < MIN_RUN_TIMEOUT_SECS ||
      input.timeout_secs > MAX_RUN_TIMEOUT_SECS)
  ) {
    return `timeout_secs must be an integer between ${MIN_RUN_TIMEOUT_SECS} and ${MAX_RUN_TIMEOUT_SECS}.`;
  }
  if (
    input.workflow_session_id !== undefined &&
    (typeof input.workflow_session_id !== "string" || input.workflow_session_id.length > MAX_WORKFLOW_SESSION_ID_LENGTH)
  ) {
    return `workflow_session_id must be a string of at most ${MAX_WORKFLOW_SESSION_ID_LENGTH} characters.`;
  }
  return null;
}
