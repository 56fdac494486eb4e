/**
 * Admission of `start_coding_agent` and of the managed start (`admit`), in the order and with the invariants of
 * docs/design.md §6.1 (told there once): validated input → scopes and project grant (decided here, once) → run id →
 * existing record → resolve → durable intent → `sent` → `run.start` with the fences.
 */
import {
  CAPACITY_REASONS,
  type CapacityReason,
  type FailureKind,
  isTerminalState,
  type RecoveryKind,
  type RunnerErrorCode,
} from "@webcodex/protocol";
import { serverFailpoint } from "../failpoints.js";
import type { RequestOutcome } from "../link/hub.js";
import type { LiveRunner } from "../link/registry.js";
import { startRefusal } from "../principals/authority.js";
import type { Principal } from "../principals/principal.js";
import { StateBusyError, type StateQueries, StateUnavailableError } from "../state/engine.js";
import type { AdmissionRecord, RecordPatch } from "../state/record.js";
import { RECORD_CHANGED } from "../state/store.js";
import type {
  AdmissionRequest,
  ApiError,
  ApiErrorCode,
  ApiResult,
  StartCallHooks,
  StartInput,
  StartOutput,
} from "./api.js";
import { fail, type RunContext } from "./context.js";
import { checkParent, checkProviderContinues, linkContinuation } from "./continuation.js";
import { deriveRunId, deriveTenantTag, intentFingerprint } from "./identity.js";
import type { Observation } from "./observe.js";

/** How many in-flight starts of the same key one start waits behind before answering start_in_progress. */
export const MAX_SAME_KEY_WAITS = 10;
/**
 * How many times one start resolves again because its record changed between the read and the
 * transaction that decides (another start of the same key or a reconciliation, on any instance)
 * before it answers start_in_progress.
 */
export const MAX_ADMISSION_ROUNDS = 3;
/** How long a run.start waits for the Runner's answer before its outcome counts as unknown. */
export const DEFAULT_START_TIMEOUT_MS = 30_000;

/** Both the Server's own check and the Runner's rejection say the same: it is the operator's setting. */
const PROJECT_NOT_WRITABLE_MESSAGE =
  "The project's Runner does not allow patches; nothing was started. An operator must set allow_patch = true for this project in the Runner's config.";

/** A principal the Server does not route to the project's same-user Runner (`shared_user_principals`). */
function sharedUserRefusal(projectId: string, principalId: string): string {
  return (
    `Project ${projectId}'s Runner runs its agents as its own OS user, and this Server gives it only the runs of ` +
    `the principals listed in its runners[].shared_user_principals; principal ${principalId} is not listed. ` +
    "Nothing was started. An operator must list the principal there, or set run_as on that Runner's agents."
  );
}

/** Pre-admission Runner rejections: API code, failure kind for the record, recovery. */
const RUNNER_REJECTIONS: Partial<
  Record<
    RunnerErrorCode,
    { code: ApiErrorCode; failure: FailureKind; recovery: RecoveryKind; message: string; reason?: CapacityReason }
  >
> = {
  stale_runner: {
    code: "stale_runner",
    failure: "runner_restarted",
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

/** What a caller is told for each capacity reason a Runner gives (protocol capacity.ts): whether retrying helps. */
const CAPACITY_ADVICE: Record<CapacityReason, string> = {
  runner_full: "Retry with the same key when one of the Runner's runs has ended.",
  pool_busy: "Retry with the same key when one of the Runner's runs has ended.",
  caller_limit: "Retry with the same key when one of your own runs on this Runner has ended.",
  pool_recycling: "Retry with the same key in a few seconds.",
  pool_bound:
    "Retrying soon will not help: ask the Runner's operator to add users to the agent's run_as pool or to release one (webcodex-runner pool release).",
};

/** The Server's answer to a Runner's `capacity` refusal that says why: its fixed words, never the Runner's text. */
function capacityRejection(reason: CapacityReason): {
  code: ApiErrorCode;
  failure: FailureKind;
  recovery: RecoveryKind;
  message: string;
  reason: CapacityReason;
} {
  const { summary, recovery } = CAPACITY_REASONS[reason];
  return {
    code: "capacity",
    failure: "capacity",
    recovery,
    message: `${summary} Nothing was started. ${CAPACITY_ADVICE[reason]}`,
    reason,
  };
}

/** What `#resolve` found for a start that goes on to be recorded and sent. */
interface Target {
  runner: LiveRunner;
  /** The fences `run.start` carries, captured at resolve. */
  fences: { agent_instance_id: string; provider_instance_id: string; store_id: string };
  /** This run id's earlier record: a pre-admission rejection being re-admitted, or an unacknowledged send. */
  existing: AdmissionRecord | undefined;
  /** The earlier record when it was sent and never acknowledged: re-sent, never marked rejected. */
  unacknowledged: AdmissionRecord | undefined;
}

/** A step that already has the start's answer. */
interface Done {
  done: ApiResult<StartOutput>;
}

function done(result: ApiResult<StartOutput>): Done {
  return { done: result };
}

/** `run.start` left (or was attempted); what came back. */
interface Sent {
  outcome: RequestOutcome;
}

type RunStatus = Pick<StartOutput, "state" | "execution_state">;

/** A start whose answer never came and whose record vanished meanwhile: what it reports. */
const STARTING: RunStatus = { state: "starting", execution_state: "not_started" };

/** The record changed since `#resolve` read it: nothing was written; resolve again. */
type Changed = typeof RECORD_CHANGED;

const START_OUTCOME_UNKNOWN_MESSAGE =
  "The start was sent to the Runner, but the Server's state database failed before the answer was recorded: the run may be running. Retry the same call (same idempotency key) once the database is back: it returns that run, and nothing is started twice.";
const START_IN_PROGRESS_MESSAGE =
  "A start with this idempotency key is still in progress; nothing new was started. Retry the same call shortly: it returns that run.";

/** A caller's bind() refusal, thrown to roll the admission transaction back. */
class BindRefused extends Error {
  constructor(readonly error: ApiError) {
    super(error.code);
  }
}

export interface AdmissionOptions {
  /** Settle a record whose start outcome is unknown against the runner's current connection. */
  settle: (runId: string) => void;
  /** Test-only: pause between resolve and run.start (WEBCODEX_TEST_HOOK_DELAY_AFTER_RESOLVE_MS). */
  testDelayAfterResolveMs?: number;
  startTimeoutMs?: number;
}

export class Admission {
  readonly #ctx: RunContext;
  readonly #observation: Observation;
  readonly #settleUnknown: (runId: string) => void;
  readonly #delayMs: number;
  readonly #startTimeoutMs: number;

  constructor(ctx: RunContext, observation: Observation, opts: AdmissionOptions) {
    this.#ctx = ctx;
    this.#observation = observation;
    this.#settleUnknown = opts.settle;
    this.#delayMs = opts.testDelayAfterResolveMs ?? 0;
    this.#startTimeoutMs = opts.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS;
  }

  async start(principal: Principal, input: StartInput, hooks: StartCallHooks = {}): Promise<ApiResult<StartOutput>> {
    // 1. authenticate: done by the front end (principal). 2. validate input: done by the front end's
    // parse with the tool's schema (mcp/tools.ts), which `input`'s type stands for.
    // 3. scopes and exact project grant: decided here, once (principals/authority.ts words the refusal).
    const denied = startRefusal(principal, input.project_id, "Starting a coding agent");
    if (denied) return { ok: false, error: denied };
    // The caller's own preparation (workflow-session selectors), only for an authorized caller.
    let prompt = input.prompt;
    let bind = hooks.bind;
    if (hooks.prepare) {
      const prepared = await hooks.prepare();
      if (!prepared.ok) return prepared;
      prompt = prepared.value.prompt;
      bind = prepared.value.bind;
    }
    // 4. derive run_id.
    const runId = deriveRunId(this.#ctx.store.serverSecret, principal.id, input.idempotency_key);
    const config = input.config ?? {};
    const timeout = input.timeout_secs ?? null;
    const parentId = input.continue_run_id;
    const fingerprint = intentFingerprint({
      project_id: input.project_id,
      provider_id: input.provider_id,
      prompt,
      config,
      timeout_secs: timeout,
      base_ref: input.base_ref,
      continue_run_id: parentId ?? null,
    });
    return this.admit(principal, {
      run_id: runId,
      intent_fingerprint: fingerprint,
      project_id: input.project_id,
      provider_id: input.provider_id,
      prompt,
      config,
      timeout_secs: timeout,
      ...(input.base_ref !== undefined ? { base_ref: input.base_ref } : {}),
      ...(parentId === undefined ? {} : { continue_run_id: parentId }),
      ...(bind === undefined ? {} : { bind }),
      afterRecorded: async () => {
        await hooks.afterRecorded?.();
        await serverFailpoint("start_after_intent");
      },
      afterDispatched: async () => {
        await hooks.afterDispatched?.();
        await serverFailpoint("start_after_run_start");
      },
    });
  }

  /**
   * Steps 5-8 for a validated, authorized request whose run id and fingerprint are derived: the one
   * admission path of start_coding_agent and of the managed path (design §10), whose `bind` runs in
   * the transaction that records the admission intent.
   */
  async admit(principal: Principal, request: AdmissionRequest): Promise<ApiResult<StartOutput>> {
    const continued = await this.#continuation(principal, request);
    if ("code" in continued) return { ok: false, error: continued };
    const req = continued;
    const runId = req.run_id;
    // Same key in flight: wait for it, then meet its record.
    for (let i = 0; i < MAX_SAME_KEY_WAITS; i++) {
      const inflight = this.#ctx.starting.get(runId);
      if (!inflight) break;
      await inflight.catch(() => undefined);
    }
    if (this.#ctx.starting.has(runId)) return fail("start_in_progress", START_IN_PROGRESS_MESSAGE, "retry_same");
    const work = this.#startLocked(principal, req);
    this.#ctx.starting.set(runId, work);
    try {
      return await work;
    } finally {
      if (this.#ctx.starting.get(runId) === work) this.#ctx.starting.delete(runId);
      // A start whose outcome is unknown: a hello that arrived meanwhile skipped it as busy, and a
      // timeout on a live link brings no hello at all. Settle it now against the current connection.
      void this.#ctx.store.get(runId).then(
        (rec) => {
          if (rec?.admission === "sent") this.#settleUnknown(runId);
        },
        (err: unknown) =>
          this.#ctx.log.error({ run_id: runId, err: (err as Error).message }, "settling an unknown start failed"),
      );
    }
  }

  /**
   * Continuation (design §17), for every caller of the one admission path (start_coding_agent, the task run):
   * the parent's checks before anything is recorded, and the parent → child link written with the intent, in
   * the caller's `bind` transaction (one child per parent). A request that continues nothing is returned as is.
   */
  async #continuation(principal: Principal, req: AdmissionRequest): Promise<AdmissionRequest | ApiError> {
    const parentId = req.continue_run_id;
    if (parentId === undefined) return req;
    const refused = checkParent(principal, parentId, await this.#ctx.store.get(parentId), req);
    if (refused) return refused;
    const callerBind = req.bind;
    return {
      ...req,
      bind: async (fences, tx) =>
        (await linkContinuation(tx, parentId, req.run_id)) ?? (await callerBind?.(fences, tx)) ?? null,
    };
  }

  /**
   * Steps 5-8 under the same-key lock, as four named steps: resolve (existing record, project →
   * runner → provider and their fences) → record (the intent, with the caller's bind, in one
   * transaction) → send (the FULL `sent` commit, then `run.start`) → settle (the Runner's answer).
   * Every success goes through `#answer`.
   */
  async #startLocked(principal: Principal, req: AdmissionRequest): Promise<ApiResult<StartOutput>> {
    let resolved: Target | undefined;
    let recorded: AdmissionRecord | undefined;
    for (let round = 0; round < MAX_ADMISSION_ROUNDS && recorded === undefined; round++) {
      const target = await this.#resolve(principal, req);
      if (target === RECORD_CHANGED) continue;
      if ("done" in target) return target.done;
      const outcome = await this.#record(principal, req, target);
      if (outcome === RECORD_CHANGED) continue;
      if ("code" in outcome) return { ok: false, error: outcome };
      resolved = target;
      recorded = outcome;
    }
    if (resolved === undefined || recorded === undefined) {
      return fail("start_in_progress", START_IN_PROGRESS_MESSAGE, "retry_same");
    }
    await req.afterRecorded?.();
    if (this.#delayMs > 0) {
      this.#ctx.log.warn(
        { run_id: req.run_id, ms: this.#delayMs },
        "TEST HOOK: delaying between resolve and run.start",
      );
      await new Promise((r) => setTimeout(r, this.#delayMs));
    }
    const sent = await this.#send(principal, req, resolved, recorded);
    if ("done" in sent) return sent.done;
    // From here `run.start` has gone out (or may have): a store failure is no longer "nothing sent". Only a
    // link that was busy or closed before the frame left (`busy`, `not_sent`) proves it did not.
    const mayHaveReached = sent.outcome.ok || (sent.outcome.reason !== "busy" && sent.outcome.reason !== "not_sent");
    try {
      if (sent.outcome.ok) await req.afterDispatched?.();
      return await this.#settle(req, resolved, sent.outcome);
    } catch (err) {
      if (!mayHaveReached || !(err instanceof StateUnavailableError || err instanceof StateBusyError)) throw err;
      this.#ctx.log.warn(
        { run_id: req.run_id, code: err.code },
        "run.start sent, its answer not recorded: the state database failed; a same-key retry meets the run",
      );
      return fail("start_outcome_unknown", START_OUTCOME_UNKNOWN_MESSAGE, "retry_same");
    }
  }

  /**
   * Step 5 (existing record: replay, conflict, or re-admit) and step 6 (project → runner → provider,
   * capturing the fences). Reads outside a transaction; what it decides is written by `#record` (or, for
   * an offline runner, `#recordRejection`) only if the record is still the one read here (`StateStore.decide`).
   */
  async #resolve(principal: Principal, req: AdmissionRequest): Promise<Target | Done | Changed> {
    const runId = req.run_id;
    const existing = await this.#ctx.store.get(runId);
    if (existing) {
      if (existing.intent_fingerprint !== req.intent_fingerprint) {
        return done(
          fail(
            "idempotency_conflict",
            "This idempotency key was already used for a different request; use a new key or repeat the original request.",
            "fix_input",
          ),
        );
      }
      // A record sent but never acknowledged (and not settled since): send the same run.start again — the
      // Runner answers an id it ever admitted with that run (or its tombstone), never a second admission.
      const resend = existing.admission === "sent" && !isTerminalState(existing.state);
      // An intent never marked `sent` sent nothing (run.start leaves only after that commit): its start failed
      // there (the database went away) or its instance died, and nothing else moves it while the Runner's link
      // stays up. Recorded again and sent; if its own start is still going on another instance, the `sent`
      // compare-and-set lets exactly one of the two send.
      const stranded = existing.admission === "intent_recorded";
      if (existing.admission !== "rejected_pre_admission" && !resend && !stranded) {
        return done(this.#replay(existing, principal));
      }
      // A pre-admission rejection: an exact retry may re-admit (retry_same).
    }
    const unacknowledged = existing?.admission === "sent" ? existing : undefined;
    const res = await this.#ctx.registry.resolveProject(req.project_id);
    const runnerId =
      res.kind === "unknown_project" ? undefined : res.kind === "runner_offline" ? res.runnerId : res.runner.runnerId;
    if (res.kind === "unknown_project" || runnerId === undefined) {
      return done(fail("not_found", `Project ${req.project_id} is not configured on this Server.`, "fix_input"));
    }
    // Nothing below may mark an unacknowledged record as rejected: the earlier run.start may have been admitted.
    if (unacknowledged && res.kind !== "ok") return done(this.#replay(unacknowledged, principal));
    if (res.kind === "runner_offline") {
      if ((await this.#recordRejection(existing, principal, req, runnerId, "never_admitted")) === RECORD_CHANGED) {
        return RECORD_CHANGED;
      }
      return done(
        fail(
          "runner_unavailable",
          "The project's Runner is offline; nothing was started. Retry with the same key.",
          "retry_same",
        ),
      );
    }
    if (res.kind === "not_advertised") {
      return done(fail("runner_unavailable", "The project's Runner does not serve this project right now.", "wait"));
    }
    const { runner, project } = res;
    const provider = runner.providers.find((p) => p.provider_id === req.provider_id);
    if (!provider) {
      const offered = runner.providers.map((p) => `${p.provider_id} (${p.name})`).join(", ") || "none";
      return done(
        fail(
          "provider_unavailable",
          `Unknown provider ${req.provider_id} for project ${req.project_id}. Available providers: ${offered}.`,
          "fix_input",
        ),
      );
    }
    if (!project.allow_patch) return done(fail("forbidden", PROJECT_NOT_WRITABLE_MESSAGE, "none"));
    if (req.continue_run_id !== undefined) {
      const unsupported = checkProviderContinues(provider);
      if (unsupported) return done({ ok: false, error: unsupported });
    }
    if (!this.#ctx.registry.servesPrincipal(runner, principal.id)) {
      if (unacknowledged) return done(this.#replay(unacknowledged, principal));
      return done(fail("forbidden", sharedUserRefusal(req.project_id, principal.id), "none"));
    }
    // Another store cannot answer for the first send: reconciliation judges that record (lost), not a re-send.
    if (unacknowledged && unacknowledged.store_id !== null && unacknowledged.store_id !== runner.storeId) {
      return done(this.#replay(unacknowledged, principal));
    }
    const fences = {
      agent_instance_id: runner.agentInstanceId,
      provider_instance_id: provider.provider_instance_id,
      store_id: runner.storeId,
    };
    return { runner, fences, existing, unacknowledged };
  }

  /**
   * Step 7: the admission intent, durably enough. One transaction (`StateStore.decide`: the same-key decision of
   * `#resolve` — insert, re-admit or re-send — holds only if the record is still the one it read): a
   * caller's binding (the managed path, the session recorder) and the intent commit together or not at
   * all. No fsync of its own on SQLite: nothing leaves before the `sent` (or rejection) commit of `#send`,
   * a FULL one that makes this one durable too; a crash of this process keeps it (state/store.ts
   * `transaction`). Returns the intent as written, or the caller's refusal.
   */
  async #record(
    principal: Principal,
    req: AdmissionRequest,
    target: Target,
  ): Promise<AdmissionRecord | ApiError | Changed> {
    const { runner, fences, existing, unacknowledged } = target;
    const runId = req.run_id;
    const intent = {
      project_id: req.project_id,
      provider_id: req.provider_id,
      runner_id: runner.runnerId,
      intent_fingerprint: req.intent_fingerprint,
      ...fences,
      admission: "intent_recorded" as const,
      state: "starting" as const,
      execution_state: "not_started" as const,
      stop_reason: null,
      failure_kind: null,
      recovery_kind: "wait" as const,
      message: null,
    };
    const store = this.#ctx.store;
    try {
      return await this.#ctx.store.decide(
        runId,
        existing,
        async (tx) => {
          const denied = (await req.bind?.({ run_id: runId, runner_id: runner.runnerId, ...fences }, tx)) ?? null;
          if (denied) throw new BindRefused(denied);
          const written = unacknowledged
            ? await store.update(runId, { ...intent, admission: "sent" }, { tx })
            : existing
              ? await store.update(runId, { ...intent, cancel_forwarded: false, cancel_pending: false }, { tx })
              : await store.insert({ run_id: runId, principal_id: principal.id, ...intent }, tx);
          // Cannot happen under the lock and the FOR UPDATE read of `StateStore.decide`; rolls back if it does.
          if (written === undefined) throw new Error(`admission record ${runId} changed inside its transaction`);
          return written;
        },
        { withoutFsync: true },
      );
    } catch (err) {
      if (err instanceof BindRefused) return err.error;
      throw err;
    }
  }

  /**
   * Step 8: over the runner's current connection, the FULL `sent` commit (or, with the runner gone,
   * the FULL rejection commit), then `run.start` with the fences captured by `#resolve`.
   */
  async #send(
    principal: Principal,
    req: AdmissionRequest,
    target: Target,
    intent: AdmissionRecord,
  ): Promise<Sent | Done> {
    const { runner, fences, unacknowledged } = target;
    const runId = req.run_id;
    const conn = (await this.#ctx.registry.lookup(runner.runnerId))?.conn;
    if (!conn && unacknowledged) return done(this.#replay(unacknowledged, principal));
    // Both commits below are FULL and conditional on the intent being unchanged (compare-and-set in one
    // UPDATE): a record another instance settled meanwhile is answered as it is, and nothing is sent.
    if (!conn) {
      const rejected = await this.#ctx.store.update(
        runId,
        this.#rejectionPatch(
          "never_admitted",
          "The project's Runner went offline before dispatch; nothing was started.",
        ),
        { expect: intent },
      );
      if (!rejected) return done(await this.#replayCurrent(runId, principal));
      return done(
        fail(
          "runner_unavailable",
          "The project's Runner went offline before dispatch; nothing was started. Retry with the same key.",
          "retry_same",
        ),
      );
    }
    const marked = await this.#ctx.store.update(runId, { admission: "sent" }, { expect: intent });
    if (!marked) return done(await this.#replayCurrent(runId, principal));
    this.#ctx.noteStartSent(runId);
    const outcome = await conn.request(
      {
        type: "run.start",
        run_id: runId,
        intent_fingerprint: req.intent_fingerprint,
        project_id: req.project_id,
        provider_id: req.provider_id,
        agent_instance_id: fences.agent_instance_id,
        provider_instance_id: fences.provider_instance_id,
        prompt: req.prompt,
        config: req.config,
        timeout_secs: req.timeout_secs,
        tenant: deriveTenantTag(this.#ctx.store.serverSecret, principal.id),
        ...(req.base_ref !== undefined ? { base_ref: req.base_ref } : {}),
        ...(req.continue_run_id === undefined ? {} : { continue_run_id: req.continue_run_id }),
      },
      this.#startTimeoutMs,
    );
    return { outcome };
  }

  /**
   * The Runner's answer to `run.start` (or its absence), applied to the record: not sent (a rejection
   * the same key may retry), unknown (left `sent` for reconciliation), admitted, answered from the
   * Runner's tombstone, or rejected before admission.
   */
  async #settle(req: AdmissionRequest, target: Target, outcome: RequestOutcome): Promise<ApiResult<StartOutput>> {
    const { runner, unacknowledged } = target;
    const runId = req.run_id;
    const instance = runner.agentInstanceId;
    if (!outcome.ok) {
      if ((outcome.reason === "busy" || outcome.reason === "not_sent") && !unacknowledged) {
        const after = await this.#rejectUnlessSettled(
          runId,
          this.#rejectionPatch("never_admitted", "The Runner link was busy; nothing was started."),
        );
        if (after !== null) return this.#answer(runId, after, true, instance);
        return fail(
          "runner_unavailable",
          "The Runner link is busy; nothing was started. Retry with the same key.",
          "retry_same",
        );
      }
      // The frame may have reached the Runner: the outcome is unknown. Reconciliation settles it.
      this.#ctx.log.warn(
        { run_id: runId, reason: outcome.reason },
        "run.start outcome unknown; left for reconciliation",
      );
      return this.#answer(runId, (await this.#ctx.store.get(runId)) ?? STARTING, false, instance);
    }
    const frame = outcome.frame;
    if (frame.type === "run.start.result") {
      const store = this.#ctx.store;
      // No fsync of its own (state/store.ts): losing it to an OS crash leaves the record `sent`, and a
      // `sent` record is re-sent with the same run_id, which the Runner answers with this run (§6.1).
      // The next FULL commit makes it durable; the caller's answer need not wait for a disk flush. Read
      // FOR UPDATE and written in this one transaction, so the no-regress rule sees the row it changes.
      const latest = await store.transaction(
        async (tx) => {
          const rec = await store.lock(tx, runId);
          if (!rec || rec.admission === "admitted") return rec;
          return await store.update(runId, { admission: "admitted", ...this.#ctx.noRegress(rec, frame.run) }, { tx });
        },
        { durability: "relaxed" },
      );
      const mirror = this.#ctx.mirrors.getOrCreate(runId);
      if (mirror.instance !== instance) mirror.reset(instance);
      if (!mirror.synced && mirror.size === 0 && mirror.lastSeq === 0 && frame.run.last_seq === 0)
        mirror.markSynced(frame.run);
      else void this.#observation.catchUp(mirror, runner);
      this.#ctx.log.info({ run_id: runId, runner_id: runner.runnerId, created: frame.created }, "run admitted");
      return this.#answer(runId, latest ?? frame.run, !frame.created, instance);
    }
    if (frame.type === "error" && frame.tombstone) {
      // The Runner admitted this run once and pruned its row: the tombstone is the run's outcome.
      await this.#ctx.applyTombstone(runId, frame.tombstone);
      this.#ctx.log.info({ run_id: runId, runner_id: runner.runnerId }, "start answered from the Runner's tombstone");
      return this.#answer(runId, (await this.#ctx.store.get(runId)) ?? frame.tombstone, true, instance);
    }
    if (frame.type === "error") {
      const rej =
        frame.code === "capacity" && frame.capacity_reason !== undefined
          ? capacityRejection(frame.capacity_reason)
          : RUNNER_REJECTIONS[frame.code];
      if (rej) {
        const after = await this.#rejectUnlessSettled(
          runId,
          this.#rejectionPatch(rej.failure, rej.message, rej.recovery),
        );
        if (after !== null) return this.#answer(runId, after, true, instance);
        this.#ctx.log.info(
          { run_id: runId, code: frame.code, ...(rej.reason ? { capacity_reason: rej.reason } : {}) },
          "run rejected by the Runner before admission",
        );
        const refused = fail<StartOutput>(rej.code, rej.message, rej.recovery);
        if (!refused.ok && rej.reason) refused.error.capacity_reason = rej.reason;
        return refused;
      }
      this.#ctx.log.warn({ run_id: runId, code: frame.code }, "run.start answered with an unexpected error");
      if (frame.code === "idempotency_conflict") {
        return fail("idempotency_conflict", "The Runner holds a different run under this id.", "reconcile");
      }
      return fail("internal", "The Runner could not start the run; its outcome is being reconciled.", "reconcile");
    }
    return fail("internal", "Unexpected Runner response.", "reconcile");
  }

  /**
   * Write a rejection before admission over this start's `sent` record, in one transaction on the row read
   * FOR UPDATE — unless the record settled while the start was out (another instance closed it as never
   * admitted, or another send of it was admitted): then it is left as it is. Null when the rejection was
   * written, or the record is a rejection already (the same answer: nothing started, retry the same key);
   * otherwise the record as it is, to answer from.
   */
  async #rejectUnlessSettled(runId: string, patch: RecordPatch): Promise<AdmissionRecord | null> {
    const store = this.#ctx.store;
    return await store.transaction(async (tx) => {
      const rec = await store.lock(tx, runId);
      if (rec === undefined || rec.admission === "rejected_pre_admission") return null;
      if (rec.admission !== "sent" || isTerminalState(rec.state)) return rec;
      await store.update(runId, patch, { tx });
      return null;
    });
  }

  /** The one builder of a start's success: the run's state and an observation token from seq 0. */
  #answer(runId: string, status: RunStatus, replayed: boolean, instance: string): ApiResult<StartOutput> {
    return {
      ok: true,
      value: {
        run_id: runId,
        state: status.state,
        execution_state: status.execution_state,
        replayed,
        observation_token: this.#ctx.tokens.issue({ run_id: runId, instance, seq: 0 }),
      },
    };
  }

  /** The record as it is now, answered as a replay (another instance or a reconciliation settled it first). */
  async #replayCurrent(runId: string, principal: Principal): Promise<ApiResult<StartOutput>> {
    const rec = await this.#ctx.store.get(runId);
    if (!rec) return fail("start_in_progress", START_IN_PROGRESS_MESSAGE, "retry_same");
    return this.#replay(rec, principal);
  }

  #replay(rec: AdmissionRecord, principal: Principal): ApiResult<StartOutput> {
    this.#ctx.log.info({ run_id: rec.run_id, principal_id: principal.id }, "start replayed");
    return this.#answer(rec.run_id, rec, true, this.#tokenInstance(rec));
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

  /** The offline runner's rejection, written only if the record is still `existing` (`StateStore.decide`). */
  async #recordRejection(
    existing: AdmissionRecord | undefined,
    principal: Principal,
    req: AdmissionRequest,
    runnerId: string,
    failure: FailureKind,
  ): Promise<undefined | Changed> {
    const patch = this.#rejectionPatch(failure, "The project's Runner was offline; nothing was started.");
    const store = this.#ctx.store;
    return await this.#ctx.store.decide(req.run_id, existing, async (tx) => {
      if (existing) await store.update(req.run_id, patch, { tx });
      else await this.#insertRejection(tx, principal, req, runnerId, failure, patch);
      return undefined;
    });
  }

  async #insertRejection(
    tx: StateQueries,
    principal: Principal,
    req: AdmissionRequest,
    runnerId: string,
    failure: FailureKind,
    patch: RecordPatch,
  ): Promise<void> {
    await this.#ctx.store.insert(
      {
        run_id: req.run_id,
        principal_id: principal.id,
        project_id: req.project_id,
        provider_id: req.provider_id,
        runner_id: runnerId,
        intent_fingerprint: req.intent_fingerprint,
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
      },
      tx,
    );
  }

  /** The agent instance a replayed run's token names: its mirror's, else its runner's live one, else its record's. */
  #tokenInstance(rec: AdmissionRecord): string {
    const mirror = this.#ctx.mirrors.get(rec.run_id);
    return (
      mirror?.instance ??
      this.#ctx.registry.live(rec.runner_id)?.agentInstanceId ??
      rec.agent_instance_id ??
      "no_runner_instance"
    );
  }
}
