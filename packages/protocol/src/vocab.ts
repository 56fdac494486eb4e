/**
 * The shared run vocabulary of design §3: states, execution certainty,
 * recovery advice, failure kinds with fixed summaries, and the closed
 * stop-reason mapping.
 */
import { z } from "zod";

export const RUN_STATES = [
  "starting",
  "running",
  "waiting_permission",
  "completed",
  "failed",
  "cancelled",
  "lost",
] as const;
export const RunState = z.enum(RUN_STATES);
export type RunState = z.infer<typeof RunState>;

export const TERMINAL_STATES: ReadonlySet<RunState> = new Set(["completed", "failed", "cancelled", "lost"]);
export function isTerminalState(state: RunState): boolean {
  return TERMINAL_STATES.has(state);
}

export const EXECUTION_STATES = ["not_started", "started", "completed", "outcome_unknown"] as const;
export const ExecutionState = z.enum(EXECUTION_STATES);
export type ExecutionState = z.infer<typeof ExecutionState>;

export const RECOVERY_KINDS = ["none", "wait", "reobserve", "reconcile", "fix_input", "retry_same"] as const;
export const RecoveryKind = z.enum(RECOVERY_KINDS);
export type RecoveryKind = z.infer<typeof RecoveryKind>;

/** Durable phase of a run on the Runner (design §4.4). */
export const RUN_PHASES = ["admitted", "setup", "dispatch_barrier", "terminal"] as const;
export const RunPhase = z.enum(RUN_PHASES);
export type RunPhase = z.infer<typeof RunPhase>;

/** ACP setup stages named in failure messages. */
export const SETUP_STAGES = ["spawn", "initialize", "session_new", "set_config_option", "prompt"] as const;
export const SetupStage = z.enum(SETUP_STAGES);
export type SetupStage = z.infer<typeof SetupStage>;

/**
 * Closed set of failure kinds, each with a fixed, secret-free summary.
 * Raw provider text never replaces these.
 */
export const FAILURE_SUMMARIES = {
  provider_spawn_failed: "The agent process could not be started.",
  provider_exited: "The agent process exited.",
  stdout_closed: "The agent closed its output stream.",
  malformed_message: "The agent wrote a message that is not valid JSON-RPC.",
  oversized_message: "The agent wrote a message larger than the allowed size.",
  io_error: "Reading from or writing to the agent failed.",
  setup_timeout: "The agent did not finish setting up in time.",
  provider_rejected: "The agent rejected a setup request.",
  invalid_config: "The requested configuration is not valid for this agent.",
  forced_config_unsatisfied: "The agent could not be held to the operator's forced configuration.",
  missing_env: "An environment variable the agent needs is not set on the Runner.",
  stop_reason: "The agent ended the turn without completing it.",
  prompt_error: "The agent answered the prompt with an error.",
  protocol_violation: "The agent broke the Agent Client Protocol.",
  unsupported_protocol_version: "The agent speaks an unsupported ACP protocol version.",
  run_timeout: "The run reached its deadline.",
  permission_timeout:
    "The agent's permission request reached its deadline unanswered; WebCodex never grants permissions.",
  stale_provider: "The provider instance changed before the run was admitted.",
  capacity: "The Runner is already running as many runs as it allows.",
  runner_restarted: "The Runner restarted before the prompt was dispatched.",
  transport_lost: "The connection to the agent was lost after the prompt was dispatched.",
  never_admitted: "The Runner never admitted this run; no prompt was dispatched.",
  runner_store_changed: "The Runner's durable store changed; the run's outcome cannot be proved.",
  missing_on_runner: "The Runner has no record of this run; its outcome cannot be proved.",
  workspace_failed:
    "The run's workspace (a git worktree of the project) could not be made: is base_ref a branch, tag or commit of the project?",
} as const;
export type FailureKind = keyof typeof FAILURE_SUMMARIES;
export const FAILURE_KINDS = Object.keys(FAILURE_SUMMARIES) as [FailureKind, ...FailureKind[]];
export const FailureKindSchema = z.enum(FAILURE_KINDS);

/** ACP v1 stop reasons this build recognises. */
export const KNOWN_STOP_REASONS = ["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"] as const;
export const StopReason = z.enum(KNOWN_STOP_REASONS);
export type StopReason = z.infer<typeof StopReason>;

export interface StopReasonOutcome {
  state: "completed" | "failed" | "cancelled";
  execution_state: "completed";
  /** The recognised stop reason, or null for a value outside the closed set. */
  stop_reason: StopReason | null;
  failure_kind: FailureKind | null;
  recovery_kind: RecoveryKind;
}

/**
 * The closed stop-reason mapping of design §3. A correlated prompt response
 * always means the prompt ran to an answer, so execution_state is `completed`.
 */
export function mapStopReason(stopReason: string): StopReasonOutcome {
  switch (stopReason) {
    case "end_turn":
      return {
        state: "completed",
        execution_state: "completed",
        stop_reason: "end_turn",
        failure_kind: null,
        recovery_kind: "none",
      };
    case "cancelled":
      return {
        state: "cancelled",
        execution_state: "completed",
        stop_reason: "cancelled",
        failure_kind: null,
        recovery_kind: "none",
      };
    case "max_tokens":
    case "max_turn_requests":
    case "refusal":
      return {
        state: "failed",
        execution_state: "completed",
        stop_reason: stopReason,
        failure_kind: "stop_reason",
        recovery_kind: "none",
      };
    default:
      return {
        state: "failed",
        execution_state: "completed",
        stop_reason: null,
        failure_kind: "protocol_violation",
        recovery_kind: "none",
      };
  }
}

/** Terminal message of a run known only from a Runner's tombstone (its full record was pruned). */
export const TOMBSTONE_MESSAGE =
  "The Runner pruned this run's full record and kept only its final state; its details and events are gone.";
