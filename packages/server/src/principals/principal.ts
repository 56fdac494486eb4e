/**
 * Who calls and with which authority: the closed scope set, the authenticated Principal every front end
 * hands the rest of the Server, and the refusal for want of authority. No I/O; imported by everything
 * that authenticates (principals/tokens.ts, oauth/) or checks authority.
 */
import type { RecoveryKind } from "@webcodex/protocol";

export const SCOPES = [
  "coding_agent:run",
  "project:read",
  "project:write",
  "runtime:read",
  "runtime:write",
  "job:run",
  "mcp:local",
  /**
   * The operator console (console/, design §15): read every Runner, run, audit row and OAuth grant, and
   * revoke grants. No other scope implies it and it implies none; nothing on /mcp needs or accepts it.
   */
  "operator:read",
  /**
   * Managing one's own webhook subscriptions over MCP (webhooks/tools.ts, design §18). Offered at OAuth consent
   * only to a client provisioned for `coding_agent:run`; no other scope implies it and it implies none.
   */
  "webhooks:write",
] as const;
export type Scope = (typeof SCOPES)[number];

export interface Principal {
  id: string;
  scopes: ReadonlySet<Scope>;
  /** Exact project ids this principal may use. */
  projects: ReadonlySet<string>;
}

/** A refusal for want of a scope or a grant: what every tool answers as its `forbidden` error (runs/api.ts ApiError). */
export interface Refusal {
  code: "forbidden";
  message: string;
  recovery_kind: RecoveryKind;
  /** For want of scopes: exactly the scopes this token lacks for the call. */
  missing_scopes?: Scope[];
}
