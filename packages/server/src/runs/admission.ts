/**
 * Admission of `start_coding_agent` and of the managed start (`admit`), in the order and with the invariants of
 * docs/design.md §6.1 (told there once): validated input → scopes and project grant (decided here, once) → run id →
 * existing record → resolve → durable intent → `sent` → `run.start` with the fences. The Runner's answer is settled
 * by runs/start-settle.ts; a continuation's parent checks and link are runs/continuation.ts's; the words of a
 * refusal are runs/start-refusals.ts's; a rejection's record writes runs/start-rejection.ts's; the caller's answer
 * runs/start-answer.ts's.
 */
import { isTerminalState } from "@webcodex/protocol";
import { serverFailpoint } from "../failpoints.js";
import type { RequestOutcome } from "../link/hub.js";
import { startRefusal } from "../principals/authority.js";
import type { Principal } from "../principals/principal.js";
import { StateBusyError, StateUnavailableError } from "../state/engine.js";
import type { AdmissionRecord } from "../state/record.js";
import { RECORD_CHANGED } from "../state/store.js";
import type { AdmissionRequest, ApiError, ApiResult, StartCallHooks, StartInput, StartOutput } from "./api.js";
import { fail, type RunContext } from "./context.js";
import { checkProviderContinues, continuationRequest } from "./continuation.js";
import { deriveRunId, deriveTenantTag, intentFingerprint } from "./identity.js";
import type { Observation } from "./observe.js";
import { replay, replayCurrent } from "./start-answer.js";
import {
  PROJECT_NOT_WRITABLE_MESSAGE,
  START_IN_PROGRESS_MESSAGE,
  START_OUTCOME_UNKNOWN_MESSAGE,
  sharedUserRefusal,
} from "./start-refusals.js";
import { recordRejection, rejectionPatch } from "./start-rejection.js";
import { type SentTo, settleStart } from "./start-settle.js";

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

/** What `#resolve` found for a start that goes on to be recorded and sent. */
interface Target extends SentTo {
  /** The fences `run.start` carries, captured at resolve. */
  fences: { agent_instance_id: string; provider_instance_id: string; store_id: string };
  /** This run id's earlier record: a pre-admission rejection being re-admitted, or an unacknowledged send. */
  existing: AdmissionRecord | undefined;
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

/** The record changed since `#resolve` read it: nothing was written; resolve again. */
type Changed = typeof RECORD_CHANGED;

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
    const continued = await continuationRequest(this.#ctx.store, principal, request);
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
   * Steps 5-8 under the same-key lock, as four named steps: resolve (existing record, project →
   * runner → provider and their fences) → record (the intent, with the caller's bind, in one
   * transaction) → send (the FULL `sent` commit, then `run.start`) → settle (the Runner's answer).
   * Every success goes through `answer` (runs/start-answer.ts).
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
      return await settleStart(this.#ctx, this.#observation, req, resolved, sent.outcome);
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
   * an offline runner, `recordRejection`) only if the record is still the one read here (`StateStore.decide`).
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
        return done(replay(this.#ctx, existing, principal));
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
    if (unacknowledged && res.kind !== "ok") return done(replay(this.#ctx, unacknowledged, principal));
    if (res.kind === "runner_offline") {
      if (
        (await recordRejection(this.#ctx.store, existing, principal, req, runnerId, "never_admitted")) ===
        RECORD_CHANGED
      ) {
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
      if (unacknowledged) return done(replay(this.#ctx, unacknowledged, principal));
      return done(fail("forbidden", sharedUserRefusal(req.project_id, principal.id), "none"));
    }
    // Another store cannot answer for the first send: reconciliation judges that record (lost), not a re-send.
    if (unacknowledged && unacknowledged.store_id !== null && unacknowledged.store_id !== runner.storeId) {
      return done(replay(this.#ctx, unacknowledged, principal));
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
    if (!conn && unacknowledged) return done(replay(this.#ctx, unacknowledged, principal));
    // Both commits below are FULL and conditional on the intent being unchanged (compare-and-set in one
    // UPDATE): a record another instance settled meanwhile is answered as it is, and nothing is sent.
    if (!conn) {
      const rejected = await this.#ctx.store.update(
        runId,
        rejectionPatch("never_admitted", "The project's Runner went offline before dispatch; nothing was started."),
        { expect: intent },
      );
      if (!rejected) return done(await replayCurrent(this.#ctx, runId, principal));
      return done(
        fail(
          "runner_unavailable",
          "The project's Runner went offline before dispatch; nothing was started. Retry with the same key.",
          "retry_same",
        ),
      );
    }
    const marked = await this.#ctx.store.update(runId, { admission: "sent" }, { expect: intent });
    if (!marked) return done(await replayCurrent(this.#ctx, runId, principal));
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
}
