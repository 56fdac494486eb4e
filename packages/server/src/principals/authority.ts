/**
 * Scope and grant checks of DESIGN §6.2 for the MCP front end. The run core
 * (runs/runs.ts) enforces the same rules plus run ownership; checking here as well
 * means a request without authority never reaches it.
 *
 * - Every tool needs `coding_agent:run`. No other scope implies it.
 * - start needs `project:write` and an exact grant of the project
 *   (and the Runner's allow_patch, which only the run core can see).
 * - The projects resource shows granted projects to `project:read` or
 *   `coding_agent:run` holders.
 */
import type { ApiError, Principal, Scope } from "../runs/api.js";

export const TOOL_SCOPE: Scope = "coding_agent:run";

export function hasScope(principal: Principal, scope: Scope): boolean {
  return principal.scopes.has(scope);
}

/** null when the principal may call the coding-agent tools at all. */
export function checkToolScope(principal: Principal): ApiError | null {
  if (hasScope(principal, TOOL_SCOPE)) return null;
  return {
    code: "forbidden",
    message: `This token lacks the ${TOOL_SCOPE} scope, which the coding-agent tools require. Ask the operator for a token issued with it.`,
    recovery_kind: "none",
  };
}

/** null when the principal may start a run on `projectId` (scope + exact grant). */
export function checkStartGrant(principal: Principal, projectId: string): ApiError | null {
  if (!hasScope(principal, "project:write")) {
    return {
      code: "forbidden",
      message: "Starting a run needs the project:write scope, which this token lacks.",
      recovery_kind: "none",
    };
  }
  if (!principal.projects.has(projectId)) {
    // Same answer for a project that exists elsewhere and one that does not.
    return {
      code: "forbidden",
      message: `Project '${projectId}' is not granted to this token. Read webcodex://projects for the projects you may use.`,
      recovery_kind: "fix_input",
    };
  }
  return null;
}

/** Whether the projects resource may list `projectId` for this principal. */
export function canSeeProject(principal: Principal, projectId: string): boolean {
  if (!principal.projects.has(projectId)) return false;
  return hasScope(principal, "project:read") || hasScope(principal, TOOL_SCOPE);
}
