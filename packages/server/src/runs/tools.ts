/**
 * The three model-facing run tools (design §6.3) as a ToolModule, like the task and session tools:
 * `start_coding_agent`, `observe_coding_agent`, `cancel_coding_agent`. Each takes its input as its zod
 * schema parsed it (the router's one shape check, mcp/tools.ts) and calls the RunsApi, which decides
 * scope and grant (principals/authority.ts words the refusals). The Workflow-Session selectors of a start
 * go through StartHooks (runs/api.ts), so this module never imports sessions/.
 */

import { APPLY_TOOL_NAME, CHANGES_TOOL_NAME } from "@webcodex/protocol";
import type { Principal } from "../principals/principal.js";
import {
  fail,
  ok,
  RECORDER_ARGUMENT,
  RECORDER_ENVELOPE,
  stripUndefined,
  type ToolCallOutcome,
  type ToolInvocation,
  type ToolModule,
  type ToolSpec,
} from "../tools/contract.js";
import { apiError } from "../tools/errors.js";
import {
  type ApiError,
  type RunsApi,
  type StartCallHooks,
  type StartHooks,
  WORKFLOW_SESSIONS_UNAVAILABLE,
} from "./api.js";
import type { ObserveLimits } from "./observe-limits.js";
import { checkObserveOutput } from "./observe-output.js";
import {
  ApplyToolInput,
  ApplyToolOutput,
  CancelToolInput,
  CancelToolOutput,
  ChangesToolInput,
  ChangesToolOutput,
  ObserveToolInput,
  ObserveToolOutput,
  StartToolInput,
  StartToolOutput,
} from "./tool-schemas.js";

export const RUN_TOOL_NAMES = {
  start: "start_coding_agent",
  observe: "observe_coding_agent",
  cancel: "cancel_coding_agent",
  changes: CHANGES_TOOL_NAME,
  apply: APPLY_TOOL_NAME,
} as const;
export type RunToolName = (typeof RUN_TOOL_NAMES)[keyof typeof RUN_TOOL_NAMES];

export const RUN_TOOL_SPECS: readonly ToolSpec<RunToolName>[] = [
  {
    name: RUN_TOOL_NAMES.start,
    startsRun: true,
    runView: true,
    title: "Start a coding agent run",
    description:
      "Hand a coding task to an operator-configured ACP coding agent working in a registered project. " +
      "Returns a run_id and an observation_token; follow the run with observe_coding_agent. " +
      "Never starts the same idempotency_key twice: a retry with identical inputs returns the original run (replayed: true). " +
      "Discover project and provider ids by reading the webcodex://projects resource.",
    input: StartToolInput,
    output: StartToolOutput,
    annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
  },
  {
    name: RUN_TOOL_NAMES.observe,
    runView: true,
    title: "Observe a coding agent run",
    description:
      "Return the run's state and the events new since after_observation_token, then a fresh observation_token. " +
      "With wait_secs, waits once for anything new. has_more means call again at once. " +
      "history_lost means older events are gone; the state is still authoritative.",
    input: ObserveToolInput,
    output: ObserveToolOutput,
    annotations: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  },
  {
    name: RUN_TOOL_NAMES.cancel,
    title: "Cancel a coding agent run",
    description:
      "Ask the run's agent to stop. Idempotent; a terminal run is reported as already_terminal. " +
      "Observe the run to see it reach cancelled.",
    input: CancelToolInput,
    output: CancelToolOutput,
    annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
  },
  {
    name: RUN_TOOL_NAMES.changes,
    title: "Get a coding agent run's changes",
    description:
      "For a run of a project in workspace mode `worktree`: what the run changed, as recorded on its branch when it " +
      "ended — base and head commits, the branch, one entry per changed file and the unified diff, one page at a " +
      "time (pass next_cursor as cursor for the next page; max_bytes bounds the diff of one answer). " +
      "recorded: false means the run has not ended yet: ask again once observe_coding_agent shows it terminal.",
    input: ChangesToolInput,
    output: ChangesToolOutput,
    annotations: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  },
  {
    name: RUN_TOOL_NAMES.apply,
    title: "Apply a coding agent run's changes to a branch",
    description:
      "For an ended run of a project in workspace mode `worktree`: bring the change recorded on its branch into " +
      "target_branch — by fast-forward, or by a merge commit when it merges cleanly. Never forced and never over " +
      "uncommitted work: a target checked out in the project's tree is updated with its files only when that tree " +
      "is clean (else refused apply_refused, naming the paths). A conflict changes nothing: result `conflict` names " +
      "the conflicting paths. The same idempotency_key again gets the same answer and never applies twice.",
    input: ApplyToolInput,
    output: ApplyToolOutput,
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  },
];

export interface RunToolsOptions {
  runs: RunsApi;
  /** Workflow-session selectors on start_coding_agent; without them those arguments are refused. */
  startHooks?: StartHooks;
  observeLimits: ObserveLimits;
}

export class RunTools implements ToolModule {
  readonly specs = RUN_TOOL_SPECS;
  readonly #runs: RunsApi;
  readonly #startHooks: StartHooks | undefined;
  readonly #observeLimits: ObserveLimits;

  constructor(options: RunToolsOptions) {
    this.#runs = options.runs;
    this.#startHooks = options.startHooks;
    this.#observeLimits = options.observeLimits;
  }

  /** `input` is what the tool's schema parsed (the router's one shape check, mcp/tools.ts). */
  async call(
    principal: Principal,
    name: string,
    input: unknown,
    signal?: AbortSignal,
    invocation?: ToolInvocation,
  ): Promise<ToolCallOutcome> {
    const tool = name as RunToolName;
    switch (tool) {
      case RUN_TOOL_NAMES.start:
        return this.#start(principal, input as StartToolInput, invocation);
      case RUN_TOOL_NAMES.observe:
        return this.#observe(principal, input as ObserveToolInput, signal);
      case RUN_TOOL_NAMES.cancel:
        return this.#cancel(principal, input as CancelToolInput);
      case RUN_TOOL_NAMES.changes:
        return this.#changes(principal, input as ChangesToolInput);
      case RUN_TOOL_NAMES.apply:
        return this.#apply(principal, input as ApplyToolInput);
      default: {
        const unreachable: never = tool;
        throw new Error(`unknown tool ${String(unreachable)}`);
      }
    }
  }

  /**
   * The recorder is `workflow_session_id` (2025-era) or `_wc.record` (2026-07-28 envelope; the router
   * refuses the argument on such requests), checked the same way; refusals name the one the caller used.
   * Authority is the run core's (runs/admission.ts), decided before the selectors are prepared.
   */
  async #start(principal: Principal, input: StartToolInput, invocation?: ToolInvocation): Promise<ToolCallOutcome> {
    const { workflow_session_id: recorderArgument, context_session_id, context_session_version, ...runInput } = input;
    const workflow_session_id = invocation?.record ?? recorderArgument;
    const recorder_field = invocation?.record !== undefined ? RECORDER_ENVELOPE : RECORDER_ARGUMENT;
    const selectors =
      context_session_id !== undefined || workflow_session_id !== undefined || context_session_version !== undefined;
    const startHooks = this.#startHooks;
    const prepare: StartCallHooks["prepare"] = !startHooks
      ? async () => ({ ok: false, error: apiError("invalid_input", WORKFLOW_SESSIONS_UNAVAILABLE) })
      : () =>
          startHooks.prepare(
            principal,
            stripUndefined({
              project_id: runInput.project_id,
              provider_id: runInput.provider_id,
              prompt: runInput.prompt,
              workflow_session_id,
              recorder_field,
              context_session_id,
              context_session_version,
            }),
          );
    const hooks: StartCallHooks = selectors ? { prepare } : {};
    const result = await this.#runs.start(principal, stripUndefined(runInput), hooks);
    if (!result.ok) {
      if (result.error.code === "provider_unavailable") {
        return fail(await this.#withProviders(principal, input, result.error), null);
      }
      return fail(result.error, null);
    }
    return ok(StartToolOutput.parse(result.value), result.value.run_id);
  }

  async #observe(principal: Principal, input: ObserveToolInput, signal?: AbortSignal): Promise<ToolCallOutcome> {
    const waits = (input.wait_secs ?? 0) > 0;
    const slot = waits ? this.#observeLimits.acquire(principal.id) : null;
    if (waits && !slot) {
      return fail(
        apiError(
          "too_many_observers",
          `Too many observe calls are waiting for this principal (limit ${this.#observeLimits.limit}). Wait for one to return, or observe without wait_secs.`,
        ),
        input.run_id,
      );
    }
    try {
      const result = await this.#runs.observe(principal, stripUndefined(input), signal);
      if (!result.ok) return fail(result.error, input.run_id);
      return ok(checkObserveOutput(stripUndefined(result.value)), input.run_id);
    } finally {
      slot?.release();
    }
  }

  async #cancel(principal: Principal, input: CancelToolInput): Promise<ToolCallOutcome> {
    const result = await this.#runs.cancel(principal, input);
    if (!result.ok) return fail(result.error, input.run_id);
    return ok(CancelToolOutput.parse(result.value), input.run_id);
  }

  /** Project content: the answer goes to the caller only (the audit row has the run id and outcome). */
  async #changes(principal: Principal, input: ChangesToolInput): Promise<ToolCallOutcome> {
    const result = await this.#runs.changes(principal, stripUndefined(input));
    if (!result.ok) return fail(result.error, input.run_id);
    return ok(ChangesToolOutput.parse(result.value), input.run_id);
  }

  /** Paths in the answer are project content: to the caller only (the audit row has the run id and outcome). */
  async #apply(principal: Principal, input: ApplyToolInput): Promise<ToolCallOutcome> {
    const result = await this.#runs.apply(principal, input);
    if (!result.ok) return fail(result.error, input.run_id);
    return ok(ApplyToolOutput.parse(result.value), input.run_id);
  }

  /**
   * An unknown provider is answered with the providers that project's Runner
   * advertises — ids and names only — as a structured list next to the message.
   */
  async #withProviders(
    principal: Principal,
    input: StartToolInput,
    error: ApiError,
  ): Promise<ApiError & { available_providers?: { provider_id: string; name: string }[] }> {
    const project = (await this.#runs.listProjects(principal)).find((p) => p.project_id === input.project_id);
    if (!project?.runner_online) return error;
    return {
      ...error,
      available_providers: project.providers.map((p) => ({ provider_id: p.provider_id, name: p.name })),
    };
  }
}
