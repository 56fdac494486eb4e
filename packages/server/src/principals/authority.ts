/**
 * Scope and grant checks of design §6.2: the refusals, each worded once. The run core (runs/admission.ts,
 * observe.ts, cancel.ts) and the agent-task and session services apply them, before anything else they do;
 * the tool modules and the MCP router never decide authority (the OAuth 403 challenge at the HTTP edge,
 * mcp/gate.ts, only asks the client for a wider token).
 *
 * - Every run and agent-task tool needs `coding_agent:run`. No other scope implies it (the session tools need
 *   `runtime:*` instead).
 * - start needs `project:write` and an exact grant of the project
 *   (and the Runner's allow_patch, which only the run core can see).
 * - The projects resource shows granted projects to `project:read` or
 *   `coding_agent:run` holders.
 */
import type { Principal, Refusal, Scope } from "./principal.js";

export const TOOL_SCOPE: Scope = "coding_agent:run";

export function hasScope(principal: Principal, scope: Scope): boolean {
  return principal.scopes.has(scope);
}

/**
 * The one refusal for want of scopes: null when the principal holds every scope in `needed`,
 * else `forbidden` naming `what` needs, exactly the scopes the token lacks (also as
 * `missing_scopes`, so a client's advice names them too) and how to get them.
 */
export function missingScopes(principal: Principal, needed: readonly Scope[], what: string): Refusal | null {
  const missing = needed.filter((s) => !hasScope(principal, s));
  if (missing.length === 0) return null;
  const names = missing.join(" and ");
  return {
    code: "forbidden",
    message:
      `${what} needs the ${needed.join(" and ")} scope${needed.length > 1 ? "s" : ""}; this token lacks ${names}. ` +
      `Ask the operator for a token issued with ${missing.length > 1 ? "them" : "it"}.`,
    recovery_kind: "none",
    missing_scopes: missing,
  };
}

/** The scopes a start needs, directly (start_coding_agent) or through an agent task (design §6.2, §10). */
export const START_SCOPES: readonly Scope[] = [TOOL_SCOPE, "project:write"];

/**
 * The one refusal for want of a project grant: null when `projectId` is granted to this principal exactly. The
 * same answer for a project that exists elsewhere and one that does not.
 */
export function grantRefusal(principal: Principal, projectId: string): Refusal | null {
  if (principal.projects.has(projectId)) return null;
  return {
    code: "forbidden",
    message: `Project '${projectId}' is not granted to this token. Read webcodex://projects for the projects you may use.`,
    recovery_kind: "fix_input",
  };
}

/** null when the principal may start work on `projectId` (START_SCOPES, then the exact grant); else the refusal. */
export function startRefusal(principal: Principal, projectId: string, what: string): Refusal | null {
  return missingScopes(principal, START_SCOPES, what) ?? grantRefusal(principal, projectId);
}

/** Whether the projects resource may list `projectId` for this principal. */
export function canSeeProject(principal: Principal, projectId: string): boolean {
  if (!principal.projects.has(projectId)) return false;
  return hasScope(principal, "project:read") || hasScope(principal, TOOL_SCOPE);
}
