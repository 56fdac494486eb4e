/**
 * Scope and grant checks of design §6.2 for the MCP front end. The run core
 * (runs/runs.ts) enforces the same rules plus run ownership; checking here as well
 * means a request without authority never reaches it.
 *
 * - Every tool needs `coding_agent:run`. No other scope implies it.
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

/** null when the principal may call the coding-agent tools at all. */
export function checkToolScope(principal: Principal): Refusal | null {
  return missingScopes(principal, [TOOL_SCOPE], "Every coding-agent tool");
}

/** null when the principal may start a run on `projectId` (scope + exact grant). */
export function checkStartGrant(principal: Principal, projectId: string): Refusal | null {
  const denied = missingScopes(principal, ["project:write"], "Starting a run");
  if (denied) return denied;
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
