/**
 * The closed Server<->Runner WebSocket protocol (design §5): one
 * discriminated union per direction, every object `.strict()`.
 * No frame carries paths, executables, argv, env, PIDs or raw ACP JSON-RPC.
 */
import { z } from "zod";
import {
  MAX_ALLOWED_CONFIG_OPTIONS,
  MAX_CONFIG_ENTRIES,
  MAX_CONFIG_VALUE_LENGTH,
  MAX_EFFECTIVE_CONFIG_ENTRIES,
  MAX_EVENT_LABEL_BYTES,
  MAX_EVENTS_PER_SYNC,
  MAX_EVENTS_PER_UPDATE,
  MAX_INVENTORY_RUNS,
  MAX_MESSAGE_LENGTH,
  MAX_PROJECTS,
  MAX_PROMPT_BYTES,
  MAX_PROVIDERS,
  MAX_RUN_TIMEOUT_SECS,
  MAX_USAGE_COST_AMOUNT,
  MAX_USAGE_TOKENS,
  MIN_RUN_TIMEOUT_SECS,
  PROTOCOL_VERSION,
} from "./bounds.js";
import { CapacityReasonSchema } from "./capacity.js";
import { boundedText, RunEvent } from "./events.js";
import {
  ConfigOptionId,
  Fingerprint,
  InstanceId,
  ProjectId,
  ProviderId,
  RequestId,
  ResumeSecret,
  RunId,
  RunnerId,
  TenantTag,
} from "./ids.js";
import {
  ExecutionState,
  FailureKindSchema,
  isTerminalState,
  RecoveryKind,
  RunPhase,
  RunState,
  StopReason,
} from "./vocab.js";
import {
  ApplyKeyHash,
  ApplyRefusal,
  BaseRef,
  ChangesCursor,
  MAX_CHANGES_PAGE_BYTES,
  MIN_CHANGES_PAGE_BYTES,
  RunApply,
  RunChanges,
  RunWorkspace,
  TargetBranch,
} from "./workspace.js";

/** Frame type names, one `as const` table per direction. */
export const RUNNER_FRAME = {
  hello: "hello",
  runStartResult: "run.start.result",
  runSyncResult: "run.sync.result",
  runCancelResult: "run.cancel.result",
  runChangesResult: "run.changes.result",
  runApplyResult: "run.apply.result",
  runUpdate: "run.update",
  error: "error",
  heartbeat: "heartbeat",
  protocolError: "protocol_error",
} as const;
export const SERVER_FRAME = {
  helloAck: "hello.ack",
  runStart: "run.start",
  runSync: "run.sync",
  runCancel: "run.cancel",
  runChanges: "run.changes",
  runApply: "run.apply",
  heartbeat: "heartbeat",
  protocolError: "protocol_error",
} as const;

const Timestamp = z.string().max(40);
const SeqCursor = z.number().int().min(0);

/** A caller or forced config value: provider-defined string/select or boolean. Never a number. */
export const ConfigValue = z.union([z.string().max(MAX_CONFIG_VALUE_LENGTH), z.boolean()]);
export type ConfigValue = z.infer<typeof ConfigValue>;
export const ConfigMap = z
  .record(ConfigOptionId, ConfigValue)
  .refine((m) => Object.keys(m).length <= MAX_CONFIG_ENTRIES, {
    message: `must have at most ${MAX_CONFIG_ENTRIES} entries`,
  });
export type ConfigMap = z.infer<typeof ConfigMap>;

export const EffectiveConfigEntry = z.object({ id: ConfigOptionId, value: ConfigValue }).strict();
export type EffectiveConfigEntry = z.infer<typeof EffectiveConfigEntry>;

/**
 * The latest ACP `usage_update` the run's agent sent (stable ACP v1: context `used`/`size`, optional
 * `cost {amount, currency}`): numbers and an ISO 4217 code only, never text. Optional on RunSummary.
 */
export const RunUsage = z
  .object({
    used_tokens: z.number().int().min(0).max(MAX_USAGE_TOKENS).nullable(),
    context_size: z.number().int().min(0).max(MAX_USAGE_TOKENS).nullable(),
    cost_amount: z.number().min(0).max(MAX_USAGE_COST_AMOUNT).nullable(),
    cost_currency: z
      .string()
      .regex(/^[A-Z]{3}$/, "expected an ISO 4217 code")
      .nullable(),
  })
  .strict();
export type RunUsage = z.infer<typeof RunUsage>;

/** What the Runner says of one run. Identical in hello inventory, results and updates. */
export const RunSummary = z
  .object({
    run_id: RunId,
    intent_fingerprint: Fingerprint,
    project_id: ProjectId,
    provider_id: ProviderId,
    provider_instance_id: InstanceId,
    agent_instance_id: InstanceId,
    phase: RunPhase,
    state: RunState,
    execution_state: ExecutionState,
    stop_reason: StopReason.nullable(),
    failure_kind: FailureKindSchema.nullable(),
    recovery_kind: RecoveryKind,
    message: z.string().max(MAX_MESSAGE_LENGTH).nullable(),
    effective_config: z.array(EffectiveConfigEntry).max(MAX_EFFECTIVE_CONFIG_ENTRIES),
    ignored_updates: z.number().int().min(0),
    /** Highest event seq the run has produced (0 = none). */
    last_seq: SeqCursor,
    /** Lowest seq still held in the Runner's ring; last_seq + 1 when the ring is empty. */
    oldest_seq: z.number().int().min(1),
    created_at: Timestamp,
    updated_at: Timestamp,
    /** Latest usage the agent reported; absent when it reported none (or an older Runner). */
    usage: RunUsage.optional(),
    /** A `worktree` project's run (design §16): its base commit, branch and, once recorded, its change's head. */
    workspace: RunWorkspace.optional(),
  })
  .strict();
export type RunSummary = z.infer<typeof RunSummary>;

export const ProviderAdvert = z
  .object({
    provider_id: ProviderId,
    provider_instance_id: InstanceId,
    name: boundedText(MAX_EVENT_LABEL_BYTES),
    allowed_config_options: z.array(ConfigOptionId).max(MAX_ALLOWED_CONFIG_OPTIONS),
    /**
     * How the provider's agent can continue an earlier run's ACP session (design §17): `resume`
     * (session/resume), `load` (session/load), `both`, or `none`. Absent from older Runners: none.
     */
    continuation: z.enum(["none", "load", "resume", "both"]).optional(),
  })
  .strict();
export type ProviderAdvert = z.infer<typeof ProviderAdvert>;

export const ProjectAdvert = z.object({ project_id: ProjectId, allow_patch: z.boolean() }).strict();
export type ProjectAdvert = z.infer<typeof ProjectAdvert>;

/** Codes of `error` responses to a request. */
export const RUNNER_ERROR_CODES = [
  "stale_runner",
  "stale_provider",
  "capacity",
  "unknown_project",
  "project_not_writable",
  "unknown_provider",
  "idempotency_conflict",
  "not_found",
  "pruned",
  "invalid_request",
  "internal",
] as const;
export const RunnerErrorCode = z.enum(RUNNER_ERROR_CODES);
export type RunnerErrorCode = z.infer<typeof RunnerErrorCode>;

export const PROTOCOL_ERROR_CODES = [
  "frame_too_large",
  "invalid_json",
  "too_deep",
  "invalid_frame",
  "unexpected_frame",
  "unauthorized_project",
  "replaced",
  /** A hello for a runner id whose live connection is still alive, without that connection's resume secret. */
  "link_in_use",
  /** The runner's token was rotated (`webcodex-server runner-token rotate`): this link's token is no longer valid. */
  "token_revoked",
] as const;
export const ProtocolErrorCode = z.enum(PROTOCOL_ERROR_CODES);
export type ProtocolErrorCode = z.infer<typeof ProtocolErrorCode>;

// ---- Runner -> Server -------------------------------------------------------

/** A hello of another link protocol: what the peer is told (the Runner and the Server must be of one release). */
export const PROTOCOL_VERSION_MISMATCH =
  `this Server speaks Server<->Runner protocol ${PROTOCOL_VERSION} and the Runner another: ` +
  "run a Runner and a Server of the same release (see `webcodex-runner --version`)";

export const HelloFrame = z
  .object({
    type: z.literal(RUNNER_FRAME.hello),
    protocol_version: z.literal(PROTOCOL_VERSION, { error: PROTOCOL_VERSION_MISMATCH }),
    agent_instance_id: InstanceId,
    store_id: InstanceId,
    capabilities: z
      .object({
        coding_agent_run: z.object({ max_concurrent_runs: z.number().int().min(1).max(64) }).strict(),
      })
      .strict(),
    providers: z.array(ProviderAdvert).max(MAX_PROVIDERS),
    projects: z.array(ProjectAdvert).max(MAX_PROJECTS),
    inventory: z.array(RunSummary).max(MAX_INVENTORY_RUNS),
    /**
     * The secret of the last hello.ack this Runner received: proves a reconnect is the same Runner, so it may
     * take over a link the Server still thinks alive (design §5).
     */
    resume_secret: ResumeSecret.optional(),
    /**
     * True when any of this Runner's agents runs as the Runner's own OS user (no `run_as`): such an agent can
     * read the Runner's token and stop it (design §4.2). Absent from Runners that predate it: not stated.
     */
    agents_share_runner_user: z.boolean().optional(),
    /** The Runner's software version (its package version), for the operator's view. Absent from older Runners. */
    runner_version: z
      .string()
      .regex(/^[0-9A-Za-z.+-]{1,64}$/, "must be 1-64 characters of [0-9A-Za-z.+-]")
      .optional(),
  })
  .strict();

export const RunStartResultFrame = z
  .object({
    type: z.literal(RUNNER_FRAME.runStartResult),
    request_id: RequestId,
    run: RunSummary,
    /** false when the run_id already existed with the same fingerprint. */
    created: z.boolean(),
  })
  .strict();

export const RunSyncResultFrame = z
  .object({
    type: z.literal(RUNNER_FRAME.runSyncResult),
    request_id: RequestId,
    run: RunSummary,
    events: z.array(RunEvent).max(MAX_EVENTS_PER_SYNC),
    has_more: z.boolean(),
  })
  .strict();

export const RunCancelResultFrame = z
  .object({
    type: z.literal(RUNNER_FRAME.runCancelResult),
    request_id: RequestId,
    run: RunSummary,
    cancel_requested: z.boolean(),
    already_terminal: z.boolean(),
  })
  .strict();

/** The answer to `run.changes`: one page of the run's recorded change (project content: never stored by the Server). */
export const RunChangesResultFrame = z
  .object({
    type: z.literal(RUNNER_FRAME.runChangesResult),
    request_id: RequestId,
    changes: RunChanges,
  })
  .strict();

/**
 * The answer to `run.apply`: what the apply did (`apply`), or why it was refused (`refusal`) — exactly one. Paths
 * in it are project content: the Server hands them to the caller and never stores or logs them.
 */
export const RunApplyResultFrame = z
  .object({
    type: z.literal(RUNNER_FRAME.runApplyResult),
    request_id: RequestId,
    apply: RunApply.optional(),
    refusal: ApplyRefusal.optional(),
  })
  .refine((f) => (f.apply === undefined) !== (f.refusal === undefined), {
    message: "exactly one of apply and refusal is present",
    path: ["apply"],
  })
  .strict();

export const RunUpdateFrame = z
  .object({
    type: z.literal(RUNNER_FRAME.runUpdate),
    run: RunSummary,
    /** Consecutive events, the last one at or below run.last_seq. May be empty (state-only change). */
    events: z.array(RunEvent).max(MAX_EVENTS_PER_UPDATE),
  })
  .strict();

/**
 * What a Runner keeps of a run whose full record it pruned (design §6.1): that
 * it admitted the run, and how it ended. Sent with the `pruned` error code —
 * never confused with `not_found`, which means "no record and no tombstone:
 * this store never admitted that run".
 */
export const RunTombstone = z
  .object({
    run_id: RunId,
    state: RunState.refine((s) => isTerminalState(s), { message: "must be a terminal state" }),
    execution_state: ExecutionState,
    terminal_at: Timestamp,
  })
  .strict();
export type RunTombstone = z.infer<typeof RunTombstone>;

export const ErrorFrame = z
  .object({
    type: z.literal(RUNNER_FRAME.error),
    request_id: RequestId,
    code: RunnerErrorCode,
    message: z.string().max(MAX_MESSAGE_LENGTH),
    /** Present on idempotency_conflict / not_found when the Runner knows the run. */
    run: RunSummary.optional(),
    /** Present exactly on `pruned`: the run's tombstone. */
    tombstone: RunTombstone.optional(),
    /** Only on `capacity`: why (a closed set; the Server words the answer, capacity.ts). Absent from older Runners. */
    capacity_reason: CapacityReasonSchema.optional(),
  })
  .refine((f) => (f.code === "pruned") === (f.tombstone !== undefined), {
    message: "tombstone is present exactly when code is pruned",
    path: ["tombstone"],
  })
  .refine((f) => f.capacity_reason === undefined || f.code === "capacity", {
    message: "capacity_reason is present only when code is capacity",
    path: ["capacity_reason"],
  })
  .strict();

export const HeartbeatFrame = z.object({ type: z.literal("heartbeat"), sent_at: Timestamp }).strict();

export const ProtocolErrorFrame = z
  .object({
    type: z.literal("protocol_error"),
    code: ProtocolErrorCode,
    message: z.string().max(MAX_MESSAGE_LENGTH),
  })
  .strict();

export const RunnerFrame = z.discriminatedUnion("type", [
  HelloFrame,
  RunStartResultFrame,
  RunSyncResultFrame,
  RunCancelResultFrame,
  RunChangesResultFrame,
  RunApplyResultFrame,
  RunUpdateFrame,
  ErrorFrame,
  HeartbeatFrame,
  ProtocolErrorFrame,
]);
export type RunnerFrame = z.infer<typeof RunnerFrame>;

// ---- Server -> Runner -------------------------------------------------------

export const HelloAckFrame = z
  .object({
    type: z.literal(SERVER_FRAME.helloAck),
    runner_id: RunnerId,
    server_instance_id: InstanceId,
    heartbeat_interval_ms: z.number().int().min(100).max(600_000),
    /**
     * Sent in the Runner's next hello to resume this link (design §5): kept in memory, and written to the
     * Runner's state dir only when no agent runs as its user (so a restart after a crash resumes at once).
     */
    resume_secret: ResumeSecret,
  })
  .strict();

export const RunStartFrame = z
  .object({
    type: z.literal(SERVER_FRAME.runStart),
    request_id: RequestId,
    run_id: RunId,
    intent_fingerprint: Fingerprint,
    project_id: ProjectId,
    provider_id: ProviderId,
    agent_instance_id: InstanceId,
    provider_instance_id: InstanceId,
    prompt: boundedText(MAX_PROMPT_BYTES).refine((s) => s.length > 0, { message: "must not be empty" }),
    config: ConfigMap,
    timeout_secs: z.number().int().min(MIN_RUN_TIMEOUT_SECS).max(MAX_RUN_TIMEOUT_SECS).nullable(),
    /**
     * Whose run this is, as an opaque tag (design §4.2): the Runner never lets two tenants' runs share a
     * run_as user. Absent from a Server that predates tenant tags: all its runs count as one tenant.
     */
    tenant: TenantTag.optional(),
    /** Only for a `worktree` project (design §16): what the run's checkout starts from; absent: the project's HEAD. */
    base_ref: BaseRef.optional(),
    /**
     * Continue this earlier run's ACP session (design §17): a terminal run of the same tenant, project and
     * provider on this Runner, whose ACP session id the Runner kept. Absent: a fresh session.
     */
    continue_run_id: RunId.optional(),
  })
  .strict();

export const RunSyncFrame = z
  .object({
    type: z.literal(SERVER_FRAME.runSync),
    request_id: RequestId,
    run_id: RunId,
    after_seq: SeqCursor,
    max_events: z.number().int().min(0).max(MAX_EVENTS_PER_SYNC),
  })
  .strict();

export const RunCancelFrame = z
  .object({ type: z.literal(SERVER_FRAME.runCancel), request_id: RequestId, run_id: RunId })
  .strict();

/** One page of a run's recorded change (get_coding_agent_changes); `cursor` from the previous page's next_cursor. */
export const RunChangesFrame = z
  .object({
    type: z.literal(SERVER_FRAME.runChanges),
    request_id: RequestId,
    run_id: RunId,
    cursor: ChangesCursor.optional(),
    max_bytes: z.number().int().min(MIN_CHANGES_PAGE_BYTES).max(MAX_CHANGES_PAGE_BYTES),
  })
  .strict();

/**
 * Bring a run's recorded change into a branch of its project (apply_coding_agent_changes, design §16). The Runner
 * remembers the answer under (run_id, key_hash): the same key again gets the same answer, even after a
 * restart of either side.
 */
export const RunApplyFrame = z
  .object({
    type: z.literal(SERVER_FRAME.runApply),
    request_id: RequestId,
    run_id: RunId,
    target_branch: TargetBranch,
    /** The SHA-256 (hex) of the caller's idempotency key: the Runner never sees the key itself. */
    key_hash: ApplyKeyHash,
  })
  .strict();

export const ServerFrame = z.discriminatedUnion("type", [
  HelloAckFrame,
  RunStartFrame,
  RunSyncFrame,
  RunCancelFrame,
  RunChangesFrame,
  RunApplyFrame,
  HeartbeatFrame,
  ProtocolErrorFrame,
]);
export type ServerFrame = z.infer<typeof ServerFrame>;

export type HelloFrame = z.infer<typeof HelloFrame>;
export type HelloAckFrame = z.infer<typeof HelloAckFrame>;
export type RunStartFrame = z.infer<typeof RunStartFrame>;
export type RunStartResultFrame = z.infer<typeof RunStartResultFrame>;
export type RunSyncFrame = z.infer<typeof RunSyncFrame>;
export type RunSyncResultFrame = z.infer<typeof RunSyncResultFrame>;
export type RunCancelFrame = z.infer<typeof RunCancelFrame>;
export type RunCancelResultFrame = z.infer<typeof RunCancelResultFrame>;
export type RunChangesFrame = z.infer<typeof RunChangesFrame>;
export type RunChangesResultFrame = z.infer<typeof RunChangesResultFrame>;
export type RunApplyFrame = z.infer<typeof RunApplyFrame>;
export type RunApplyResultFrame = z.infer<typeof RunApplyResultFrame>;
export type RunUpdateFrame = z.infer<typeof RunUpdateFrame>;
export type ErrorFrame = z.infer<typeof ErrorFrame>;
export type HeartbeatFrame = z.infer<typeof HeartbeatFrame>;
export type ProtocolErrorFrame = z.infer<typeof ProtocolErrorFrame>;

/** Responses the Runner sends to a Server request, keyed by request frame type. */
export type RunnerResponse =
  | RunStartResultFrame
  | RunSyncResultFrame
  | RunCancelResultFrame
  | RunChangesResultFrame
  | RunApplyResultFrame
  | ErrorFrame;
