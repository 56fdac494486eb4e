/**
 * Which task, attempt and workflow session one MCP tool call was about, for its audit row
 * (`mcp_audit.task_id / attempt_id / session_id`, schema step 8). Only values that match the id
 * patterns are taken — from the call's arguments and from a successful result — so a row never holds
 * free text: never an instruction, a handoff, a goal or a prompt.
 */
import type { CallToolResult } from "@modelcontextprotocol/server";
import { SESSION_ID_PATTERN } from "../sessions/ids.js";
import { ATTEMPT_ID_PATTERN, TASK_ID_PATTERN } from "../tasks/claim.js";

export interface AuditSubjects {
  task_id: string | null;
  attempt_id: string | null;
  session_id: string | null;
}

export const NO_SUBJECTS: AuditSubjects = Object.freeze({ task_id: null, attempt_id: null, session_id: null });

function record(value: unknown): Record<string, unknown> | null {
  return typeof value === "object" && value !== null && !Array.isArray(value)
    ? (value as Record<string, unknown>)
    : null;
}

function pick(sources: readonly (Record<string, unknown> | null)[], keys: readonly string[], pattern: RegExp) {
  for (const source of sources) {
    if (!source) continue;
    for (const key of keys) {
      const v = source[key];
      if (typeof v === "string" && pattern.test(v)) return v;
    }
  }
  return null;
}

/** The subjects of one call: its result first (ids the Server minted), then its arguments. */
export function auditSubjects(args: unknown, result: CallToolResult): AuditSubjects {
  const out = result.isError ? null : record(result.structuredContent);
  const input = record(args);
  const sources = [out, record(out?.attempt), input];
  return {
    task_id: pick(sources, ["task_id"], TASK_ID_PATTERN),
    attempt_id: pick(sources, ["attempt_id"], ATTEMPT_ID_PATTERN),
    session_id: pick(sources, ["session_id", "workflow_session_id", "context_session_id"], SESSION_ID_PATTERN),
  };
}
