/**
 * The seam between the Server's run core (admission, registry, mirrors,
 * reconciliation) and its front ends (MCP tools over Streamable HTTP, the
 * stdio bridge, the projects resource). Front ends authenticate the caller
 * into a Principal; everything else — scopes, project grants, ownership,
 * allow_patch — is enforced here, so no front end can forget a check.
 */
import type {
  ConfigMap,
  EffectiveConfigEntry,
  ExecutionState,
  FailureKind,
  RecoveryKind,
  RunEvent,
  RunState,
  StopReason,
} from "@webcodex/protocol";
import { z } from "zod";
import type { ToolStep } from "./mirror.js";

export const SCOPES = [
  "coding_agent:run",
  "project:read",
  "project:write",
  "runtime:read",
  "runtime:write",
  "job:run",
  "mcp:local",
  /**
   * The operator console (console/, DESIGN §15): read every Runner, run, audit row and OAuth grant, and
   * revoke grants. No other scope implies it and it implies none; nothing on /mcp needs or accepts it.
   */
  "operator:read",
] as const;
export type Scope = (typeof SCOPES)[number];

export interface Principal {
  id: string;
  scopes: ReadonlySet<Scope>;
  /** Exact project ids this principal may use. */
  projects: ReadonlySet<string>;
}

/** Closed set of tool-level error codes (documented in the README). */
export const API_ERROR_CODES = [
  "unauthorized",
  "forbidden",
  "not_found",
  "invalid_input",
  "idempotency_conflict",
  "runner_unavailable",
  "provider_unavailable",
  "stale_runner",
  "stale_provider",
  "capacity",
  "start_in_progress",
  "invalid_observation_token",
  "too_many_observers",
  /** Managed path (DESIGN §10): the presented claim is not the task's current live claim. */
  "stale_claim",
  /** Managed path: a live attempt, or an active/uncertain Run, blocks what was asked. */
  "claim_conflict",
  /** Workflow sessions: expected_version is not the session's current version. */
  "version_conflict",
  /** Workflow sessions: context_session_version is not the context session's current version. */
  "context_version_conflict",
  "internal",
] as const;
export type ApiErrorCode = (typeof API_ERROR_CODES)[number];

export interface ApiError {
  code: ApiErrorCode;
  /** Secret-free, says what was wrong and what to do. */
  message: string;
  recovery_kind: RecoveryKind;
  /** On a `forbidden` for want of scopes: exactly the scopes this token lacks for the call (principals/authority.ts). */
  missing_scopes?: Scope[];
}

export type ApiResult<T> = { ok: true; value: T } | { ok: false; error: ApiError };

/**
 * The one rule for caller-chosen opaque strings (idempotency keys, workflow session ids): 1-128 printable
 * ASCII characters without spaces. The tool schemas and the run core's own validation both use it.
 */
export const MAX_OPAQUE_KEY_LENGTH = 128;
export const OPAQUE_KEY_RULE = `1-${MAX_OPAQUE_KEY_LENGTH} printable ASCII characters without spaces`;
export const OpaqueKey = z
  .string()
  .min(1)
  .max(MAX_OPAQUE_KEY_LENGTH)
  .regex(/^[\x21-\x7e]+$/, `must be ${OPAQUE_KEY_RULE}`);

export interface StartInput {
  project_id: string;
  provider_id: string;
  idempotency_key: string;
  prompt: string;
  config?: ConfigMap;
  timeout_secs?: number;
  workflow_session_id?: string;
}

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
 * One admission through the run core's single path (DESIGN §6.1), for callers
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
  /**
   * Runs inside the SQLite transaction that records the admission intent, before it is written.
   * An ApiError aborts the transaction: nothing is recorded and nothing is sent.
   */
  bind?(fences: AdmissionFences): ApiError | null;
  /** Called after that transaction committed, before `run.start` is sent (test failpoints). */
  afterRecorded?(): void;
  /** Called when the Runner answered `run.start`, before the answer is recorded (test failpoints). */
  afterDispatched?(): void;
}

/** The caller seams of one admission (see AdmissionRequest), for `start` callers too (workflow-session recorder). */
export type AdmissionHooks = Pick<AdmissionRequest, "bind" | "afterRecorded" | "afterDispatched">;

/**
 * What start_coding_agent asks of Workflow Sessions (sessions/service.ts implements it), checked before anything
 * reaches the run core: the recorder and context selectors, and the prompt with quoted context.
 */
export interface StartHooks {
  prepare(
    principal: Principal,
    input: {
      project_id: string;
      prompt: string;
      workflow_session_id?: string;
      /** How the caller named the recorder (`workflow_session_id` or `_wc.record`), for refusals. */
      recorder_field?: string;
      context_session_id?: string;
      context_session_version?: number;
    },
  ): ApiResult<{ prompt: string }>;
  /** The recorder link, run by the run core inside the admission transaction (before dispatch). */
  recorderBind(
    principal: Principal,
    input: { workflow_session_id: string; project_id: string; provider_id: string; recorder_field?: string },
  ): NonNullable<AdmissionHooks["bind"]>;
}

export interface RunAdmission {
  admit(principal: Principal, request: AdmissionRequest): Promise<ApiResult<StartOutput>>;
}

export interface RunsApi {
  /** `hooks.bind` runs inside the transaction that records the admission intent (the recorder link). */
  start(principal: Principal, input: StartInput, hooks?: AdmissionHooks): Promise<ApiResult<StartOutput>>;
  /** Waits at most wait_secs (capped) and returns early on anything new; aborts with `signal`. */
  observe(principal: Principal, input: ObserveInput, signal?: AbortSignal): Promise<ApiResult<ObserveOutput>>;
  cancel(principal: Principal, input: { run_id: string }): Promise<ApiResult<CancelOutput>>;
  /**
   * The newest tool step this Server holds for a run (from its event mirror, which observe keeps in step
   * with the Runner), or null when none is held. No ownership check: callers check the run's owner first.
   */
  lastToolStep(runId: string): ToolStep | null;
  /** Projects the principal may see (project:read or coding_agent:run on a granted project). */
  listProjects(principal: Principal): ProjectView[];
}
