/**
 * The scopes an OAuth client may ask for, what the consent page says about
 * each, and what the `/mcp` tools need. `coding_agent:run` is never granted
 * by default: it is offered only as its own unchecked line, and only to a
 * client the operator provisioned for it.
 */
import type { Scope } from "../principals/principal.js";

export const CODING_AGENT_RUN = "coding_agent:run" satisfies Scope;

/** Scopes an OAuth grant can carry (the others mean nothing on /mcp). Order = page order. */
export const OAUTH_SCOPES = [
  "project:read",
  "project:write",
  "runtime:read",
  "runtime:write",
  "coding_agent:run",
] as const satisfies readonly Scope[];

/** What the consent page says each scope lets the app do. */
export const SCOPE_LABELS: Record<(typeof OAUTH_SCOPES)[number], string> = {
  "project:read": "See the projects you may use and whether their Runner is online.",
  "project:write": "Write to your granted projects (needed, with coding_agent:run, to start a run).",
  "runtime:read": "Read your workflow sessions on your granted projects (handoff, goal, run evidence).",
  "runtime:write":
    "Create and update your workflow sessions on your granted projects. This starts nothing: running an agent needs coding_agent:run.",
  "coding_agent:run":
    "Start, watch and cancel coding agents on your granted projects. The agent can change files there.",
};

/** Asked for when a client sends no `scope`: everything the tools use (consent still decides). */
export const DEFAULT_REQUESTED_SCOPES: readonly Scope[] = OAUTH_SCOPES;

/** Scopes each tool needs; a token without them gets 403 insufficient_scope on /mcp. */
export const TOOL_SCOPES: Readonly<Record<string, readonly Scope[]>> = {
  start_coding_agent: ["coding_agent:run", "project:write"],
  observe_coding_agent: ["coding_agent:run"],
  cancel_coding_agent: ["coding_agent:run"],
  create_agent_task: ["coding_agent:run", "project:write"],
  start_agent_task_attempt: ["coding_agent:run", "project:write"],
  start_agent_task_coding_run: ["coding_agent:run", "project:write"],
  reconcile_agent_task_coding_run: ["coding_agent:run", "project:write"],
  close_agent_task: ["coding_agent:run", "project:write"],
  // Workflow sessions (DESIGN §11): runtime:* only — never coding_agent:run, which stays its own consent line.
  create_workflow_session: ["runtime:write"],
  update_workflow_session: ["runtime:write"],
  read_workflow_session: ["runtime:read"],
};

/**
 * The scopes `name` needs; none for a name that is not a tool. An own-property lookup: a caller's
 * tool name such as `valueOf` or `constructor` must not reach Object.prototype.
 */
export function scopesForTool(name: string): readonly Scope[] {
  return Object.hasOwn(TOOL_SCOPES, name) ? (TOOL_SCOPES[name] ?? []) : [];
}

export function isOAuthScope(value: string): value is (typeof OAUTH_SCOPES)[number] {
  return (OAUTH_SCOPES as readonly string[]).includes(value);
}

/** Requested scope string → the known OAuth scopes in it (unknown ones are dropped; none → the default). */
export function requestedScopes(scopes: readonly string[] | undefined): Scope[] {
  const list = (scopes ?? []).filter((s) => s !== "");
  if (list.length === 0) return [...DEFAULT_REQUESTED_SCOPES];
  return OAUTH_SCOPES.filter((s) => list.includes(s));
}
