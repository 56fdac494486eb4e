/**
 * The Workflow Session MCP tools (design §11), registered as a ToolModule
 * next to the run tools: `create_workflow_session`, `update_workflow_session`
 * (optimistic concurrency with expected_version), `read_workflow_session`.
 * Scopes are the service's to check: `runtime:write` / `runtime:read`, never
 * `coding_agent:run`.
 */
import {
  CreateSessionInput,
  ReadSessionInput,
  ReadSessionOutput,
  SESSION_TOOL_NAMES,
  type SessionToolName,
  SessionView,
  UpdateSessionInput,
} from "@webcodex/protocol";
import type { Principal } from "../principals/principal.js";
import { fail, ok, type Parsed, type ToolCallOutcome, type ToolModule, type ToolSpec } from "../tools/contract.js";
import type { SessionService } from "./service.js";

// The three tools' names and schemas are the MCP contract, in the protocol package (tools/sessions.ts).
export { SESSION_TOOL_NAMES } from "@webcodex/protocol";

export const SESSION_TOOL_SPECS: readonly ToolSpec<SessionToolName>[] = [
  {
    name: SESSION_TOOL_NAMES.create,
    title: "Create a workflow session",
    description:
      "Create a bounded evidence and handoff ledger on a project (needs runtime:write). Pass its id as workflow_session_id " +
      "to record a run's lifecycle, or as context_session_id to start a run from its handoff. It grants no authority.",
    input: CreateSessionInput,
    output: SessionView,
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
  },
  {
    name: SESSION_TOOL_NAMES.update,
    title: "Update a workflow session's handoff or goal",
    description:
      "Replace the handoff (≤ 16 KiB) and/or goal (≤ 4 KiB); each bumps its version. With expected_version the update " +
      "is refused if the session changed since you read it.",
    input: UpdateSessionInput,
    output: SessionView,
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
  },
  {
    name: SESSION_TOOL_NAMES.read,
    title: "Read a workflow session",
    description:
      "The session's handoff, goal, versions and lifecycle evidence entries after `after` (bounded; has_more), " +
      "with the count of entries dropped past the bound. Needs runtime:read.",
    input: ReadSessionInput,
    output: ReadSessionOutput,
    annotations: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  },
];

export class SessionTools implements ToolModule {
  readonly specs = SESSION_TOOL_SPECS;
  readonly #sessions: SessionService;

  constructor(sessions: SessionService) {
    this.#sessions = sessions;
  }

  /** `input` is what the tool's schema parsed (the router's one shape check, mcp/tools.ts). */
  async call(principal: Principal, name: string, input: unknown): Promise<ToolCallOutcome> {
    switch (name as SessionToolName) {
      case SESSION_TOOL_NAMES.create: {
        const r = await this.#sessions.create(principal, input as Parsed<typeof CreateSessionInput>);
        return r.ok ? ok(SessionView.parse(r.value), null) : fail(r.error, null);
      }
      case SESSION_TOOL_NAMES.update: {
        const v = input as Parsed<typeof UpdateSessionInput>;
        const r = await this.#sessions.update(principal, {
          session_id: v.session_id,
          ...(v.handoff !== undefined ? { handoff: v.handoff } : {}),
          ...(v.goal !== undefined ? { goal: v.goal } : {}),
          ...(v.expected_version !== undefined ? { expected_version: v.expected_version } : {}),
        });
        return r.ok ? ok(SessionView.parse(r.value), null) : fail(r.error, null);
      }
      case SESSION_TOOL_NAMES.read: {
        const v = input as Parsed<typeof ReadSessionInput>;
        const r = await this.#sessions.read(principal, {
          session_id: v.session_id,
          ...(v.after !== undefined ? { after: v.after } : {}),
        });
        return r.ok ? ok(ReadSessionOutput.parse(r.value), null) : fail(r.error, null);
      }
      default:
        throw new Error("unknown session tool");
    }
  }
}
