/**
 * The seam between the Server's run core (admission, registry, mirrors,
 * reconciliation) and its front ends (MCP tools over Streamable HTTP, the
 * stdio bridge, the projects resource). Front ends authenticate the caller
 * into a Principal; everything else — scopes, project grants, ownership,
 * allow_patch — is enforced here, so no front end can forget a check.
 */
import {
  type ApplyToolInput,
  type ChangesToolInput,
  type ConfigMap,
  type EffectiveConfigEntry,
  type ExecutionState,
  type FailureKind,
  type RecoveryKind,
  type RunApply,
  type RunChanges,
  type RunEvent,
  type RunState,
  type RunUsage,
  type RunWorkspace,
  StartInput,
  type StopReason,
} from "@webcodex/protocol";
import type { Principal } from "../principals/principal.js";
import type { StateQueries } from "../state/engine.js";
import type { ApiError, ApiResult } from "../tools/errors.js";
import type { ToolStep } from "./mirror.js";

// The opaque-key rule and the run core's start input (its only validator) are the run tools' contract, in the
// protocol package (tools/runs.ts): start_coding_agent's schema extends StartInput there.
export { MAX_OPAQUE_KEY_LENGTH, OPAQUE_KEY_RULE, OpaqueKey } from "@webcodex/protocol";
// The identity types live with the principals; they are re-exported here for the front ends that take
// them with the RunsApi.
export { type Principal, SCOPES, type Scope } from "../principals/principal.js";
// The answer vocabulary every front end and tool shares (codes, ApiError, ApiResult) lives below them, with the
// tool contract (tools/errors.ts); re-exported for the run core's callers.
export { API_ERROR_CODES, type ApiError, type ApiErrorCode, type ApiResult } from "../tools/errors.js";
export { StartInput };

export interface StartOutput {
  run_id: string;
  state: RunState;
  execution_state: ExecutionState;
  replayed: boolean;
  observation_token: string;
}

export interface ObserveInput {
  run_id: string;
  after_observation_token?: string;
  wait_secs?: number;
}

export interface ObserveOutput {
  run_id: string;
  state: RunState;
  execution_state: ExecutionState;
  stop_reason?: StopReason;
  failure_kind?: FailureKind;
  recovery_kind: RecoveryKind;
  message?: string;
  events: RunEvent[];
  observation_token: string;
  history_lost: boolean;
  has_more: boolean;
  /** Present and true while the run's Runner is not connected: state is the last known one. */
  runner_offline?: boolean;
  /** Every config option the agent advertised for this run, with its value (bounded; empty before setup). */
  effective_config: EffectiveConfigEntry[];
  /** The latest usage the agent reported (numbers only); absent until it reported any. */
  usage?: RunUsage;
  /** When the Runner admitted the run (its clock); absent until this Server holds the Runner's summary. */
  started_at?: string;
  /** The run's terminal event's time (the Runner's clock, as `started_at`); absent until it ended. */
  ended_at?: string;
  /** A worktree run's workspace (design §16), from the Runner's latest summary this Server holds. */
  workspace?: RunWorkspace;
  /** Continuation (design §17): the run this one continues; absent when it started a fresh session. */
  parent_run_id?: string;
  /** Continuation: the run that continues this one; absent until one was admitted. */
  continued_by?: string;
}

export interface CancelOutput {
  run_id: string;
  state: RunState;
  cancel_requested: boolean;
  already_terminal: boolean;
}

export interface ProviderView {
  provider_id: string;
  name: string;
  allowed_config_options: string[];
}

export interface ProjectView {
  project_id: string;
  runner_online: boolean;
  allow_patch: boolean;
  /**
   * The online Runner's hello: true when its agents run as its own OS user (they can read its token), false
   * when every agent runs as another user; null when offline or not stated.
   */
  agents_share_runner_user: boolean | null;
  providers: ProviderView[];
}

/** The fences the admission path captured for one run (what `run.start` will carry). */
export interface AdmissionFences {
  run_id: string;
  runner_id: string;
  agent_instance_id: string;
  provider_instance_id: string;
  store_id: string;
}

/**
 * One admission through the run core's single path (design §6.1), for callers
 * that derive the run id and fingerprint themselves (the managed path, §10).
 * Inputs are already validated and authorized by the caller.
 */
export interface AdmissionRequest {
  run_id: string;
  intent_fingerprint: string;
  project_id: string;
  provider_id: string;
  prompt: string;
  config: ConfigMap;
  timeout_secs: number | null;
  /** Only for a `worktree` project (design §16): what the run's checkout starts from; absent: the project's HEAD. */
  base_ref?: string;
  /** The terminal run this one continues (design §17); `admit` checks it against the caller (runs/continuation.ts). */
  continue_run_id?: string;
  /**
   * Runs inside the state transaction that records the admission intent (`tx`), before it is written:
   * a store on the state engine writes through `tx`; one still on the SQLite connection writes there
   * (the same transaction on SQLite). An ApiError aborts the transaction: nothing is recorded and
   * nothing is sent.
   */
  bind?(fences: AdmissionFences, tx: StateQueries): ApiError | null | Promise<ApiError | null>;
  /** Called after that transaction committed, before `run.start` is sent (test failpoints; awaited). */
  afterRecorded?(): void | Promise<void>;
  /** Called when the Runner answered `run.start`, before the answer is recorded (test failpoints; awaited). */
  afterDispatched?(): void | Promise<void>;
}

/** The caller seams of one admission (see AdmissionRequest), for `start` callers too (workflow-session recorder). */
export type AdmissionHooks = Pick<AdmissionRequest, "bind" | "afterRecorded" | "afterDispatched">;

/**
 * What a `start` caller may add to its admission. `prepare` (start_coding_agent's Workflow-Session selectors,
 * StartHooks) runs once the run core decided the caller's authority and before the run id is derived: it may
 * refuse, replace the prompt (quoted context) and give the admission's `bind` (the recorder link).
 */
export interface StartCallHooks extends AdmissionHooks {
  prepare?(): Promise<ApiResult<{ prompt: string; bind?: NonNullable<AdmissionHooks["bind"]> }>>;
}

/** How a tool without Workflow Sessions answers a session selector (invalid_input). */
export const WORKFLOW_SESSIONS_UNAVAILABLE = "Workflow sessions are not available on this Server; nothing was started.";

/**
 * What start_coding_agent asks of Workflow Sessions (sessions/service.ts implements it), checked before anything
 * reaches the run core: the recorder and context selectors. The answer is the prompt with quoted context and,
 * with a recorder, the recorder link as the admission's `bind` (run inside the admission transaction).
 */
export interface StartHooks {
  prepare(
    principal: Principal,
    input: {
      project_id: string;
      provider_id: string;
      prompt: string;
      workflow_session_id?: string;
      /** How the caller named the recorder (`workflow_session_id` or `_wc.record`), for refusals. */
      recorder_field?: string;
      context_session_id?: string;
      context_session_version?: number;
    },
  ): Promise<ApiResult<{ prompt: string; bind?: NonNullable<AdmissionHooks["bind"]> }>>;
}

export interface RunAdmission {
  admit(principal: Principal, request: AdmissionRequest): Promise<ApiResult<StartOutput>>;
}

export interface RunsApi {
  /**
   * Scopes and the project grant first (the one check, runs/admission.ts), then `hooks.prepare`; `hooks.bind` runs
   * inside the transaction that records the admission intent (the recorder link).
   */
  start(principal: Principal, input: StartInput, hooks?: StartCallHooks): Promise<ApiResult<StartOutput>>;
  /** Waits at most wait_secs (capped) and returns early on anything new; aborts with `signal`. */
  observe(principal: Principal, input: ObserveInput, signal?: AbortSignal): Promise<ApiResult<ObserveOutput>>;
  cancel(principal: Principal, input: { run_id: string }): Promise<ApiResult<CancelOutput>>;
  /** One page of a worktree run's recorded change (runs/changes.ts): the owner's only; never stored or logged. */
  changes(principal: Principal, input: ChangesToolInput): Promise<ApiResult<RunChanges>>;
  /** Bring a worktree run's change into a branch (runs/apply.ts): idempotent per key on the Runner; paths to the caller only. */
  apply(principal: Principal, input: ApplyToolInput): Promise<ApiResult<RunApply>>;
  /**
   * The newest tool step this Server holds for a run (from its event mirror, which observe keeps in step
   * with the Runner), or null when none is held. No ownership check: callers check the run's owner first.
   */
  lastToolStep(runId: string): ToolStep | null;
  /** Projects the principal may see (project:read or coding_agent:run on a granted project). */
  listProjects(principal: Principal): Promise<ProjectView[]>;
}
