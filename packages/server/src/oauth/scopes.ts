/**
 * The scopes an OAuth client may ask for, what the consent page says about
 * each, and what the `/mcp` tools need. `coding_agent:run` is never granted
 * by default: it is offered only as its own unchecked line, and only to a
 * client the operator provisioned for it.
 */
import type { Scope } from "../principals/principal.js";

export const CODING_AGENT_RUN = "coding_agent:run" satisfies Scope;
/** Offered only to a client the operator provisioned for it (operator-read.ts); never asked for by default. */
export const OPERATOR_READ_SCOPE = "operator:read" satisfies Scope;
/**
 * Offered only to a client provisioned for `coding_agent:run` (`allow_coding_agent_run`: the operator's one
 * provisioning of a client for acting agents), and carried by a token only while it still is; never asked for by
 * default: a client names it.
 */
export const WEBHOOKS_WRITE_SCOPE = "webhooks:write" satisfies Scope;

/** Scopes an OAuth grant can carry (the others mean nothing on /mcp). Order = page order. */
export const OAUTH_SCOPES = [
  "project:read",
  "project:write",
  "runtime:read",
  "runtime:write",
  "coding_agent:run",
  "webhooks:write",
  "operator:read",
] as const satisfies readonly Scope[];

/** What the consent page says each scope lets the app do, in words for the person signing in. */
export const SCOPE_LABELS: Record<(typeof OAUTH_SCOPES)[number], string> = {
  "project:read": "See which of your projects it can use and whether each one is online.",
  "project:write": "Make changes in your projects (starting work there needs this too).",
  "runtime:read": "Read your work sessions in your projects: goals, handoff notes and what earlier runs did.",
  "runtime:write": "Create and update your work sessions in your projects. This alone starts no coding agent.",
  "coding_agent:run": "Start, watch and stop coding agents in your projects. An agent can change files there.",
  "webhooks:write":
    "Add and remove web addresses this Server notifies when your runs and tasks change (ids and states only).",
  "operator:read":
    "See every Runner, run, audit record and OAuth grant of this Server (the operator console), for all users.",
};

/**
 * Asked for when a client sends no `scope`: everything the tools use (consent still decides); never operator:read
 * or webhooks:write (a client names those).
 */
export const DEFAULT_REQUESTED_SCOPES: readonly Scope[] = OAUTH_SCOPES.filter(
  (s) => s !== OPERATOR_READ_SCOPE && s !== WEBHOOKS_WRITE_SCOPE,
);

/** Scopes each tool needs; a token without them gets 403 insufficient_scope on /mcp. */
export const TOOL_SCOPES: Readonly<Record<string, readonly Scope[]>> = {
  start_coding_agent: ["coding_agent:run", "project:write"],
  observe_coding_agent: ["coding_agent:run"],
  cancel_coding_agent: ["coding_agent:run"],
  get_coding_agent_changes: ["coding_agent:run"],
  apply_coding_agent_changes: ["coding_agent:run", "project:write"],
  create_agent_task: ["coding_agent:run", "project:write"],
  start_agent_task_attempt: ["coding_agent:run", "project:write"],
  start_agent_task_coding_run: ["coding_agent:run", "project:write"],
  reconcile_agent_task_coding_run: ["coding_agent:run", "project:write"],
  close_agent_task: ["coding_agent:run", "project:write"],
  // Workflow sessions (design §11): runtime:* only — never coding_agent:run, which stays its own consent line.
  create_workflow_session: ["runtime:write"],
  update_workflow_session: ["runtime:write"],
  read_workflow_session: ["runtime:read"],
  // A principal's own webhook subscriptions (design §18).
  list_webhook_subscriptions: ["webhooks:write"],
  add_webhook_subscription: ["webhooks:write"],
  remove_webhook_subscription: ["webhooks:write"],
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

/**
 * Requested scope names → the known OAuth scopes among them, in page order. Unknown names (hosts send
 * their own, e.g. `claudeai`) are ignored, never an error; a request naming no known scope — or none
 * at all — asks for the default set. Consent still grants only what the key and client allow.
 */
export function requestedScopes(scopes: readonly string[] | undefined): Scope[] {
  const list = scopes ?? [];
  const known = OAUTH_SCOPES.filter((s) => list.includes(s));
  return known.length === 0 ? [...DEFAULT_REQUESTED_SCOPES] : known;
}
