/**
 * The OAuth store's rows and values (oauth/store.ts): the table row shapes, what a decision returns,
 * the code and token prefixes and lifetimes, and the hashing every code and token is stored under.
 */
import { createHash, randomBytes } from "node:crypto";
import type { Scope } from "../principals/principal.js";

export type ClientKind = "dynamic" | "cimd" | "operator";

export interface ClientRow {
  client_id: string;
  kind: ClientKind;
  client_name: string | null;
  /** JSON array. */
  redirect_uris: string;
  allow_coding_agent_run: number;
  created_at: string;
  /** For metadata-document clients: when the document was last fetched (null: never). */
  fetched_at: string | null;
  revoked_at: string | null;
  /** The issuer (`public_url`) a dynamic client was registered under; null for other kinds and older rows. */
  issuer: string | null;
}

export interface GrantRow {
  grant_id: string;
  client_id: string;
  principal_id: string;
  /** The access key's token id (`tok_…`), or null for a key declared in the config. */
  key_id: string | null;
  scopes: string;
  projects: string;
  resource: string;
  created_at: string;
  revoked_at: string | null;
  revoked_reason: string | null;
}

export interface CodeRow {
  code_hash: string;
  grant_id: string;
  client_id: string;
  redirect_uri: string;
  code_challenge: string;
  expires_at: number;
  used_at: number | null;
}

export interface TokenRow {
  token_hash: string;
  kind: "access" | "refresh";
  grant_id: string;
  client_id: string;
  scopes: string;
  resource: string;
  expires_at: number;
  used_at: number | null;
  /** A spent refresh token's successor pair, encrypted (see the header); null outside the grace window. */
  successor: Buffer | null;
}

export type OAuthAuditEvent =
  | "grant"
  | "consent_denied"
  | "code_reused"
  | "refresh_reused"
  | "refresh_replayed"
  | "grant_revoked"
  | "client_registered"
  | "client_revoked"
  | "client_provisioned"
  | "client_unprovisioned"
  | "token_revoked";

export interface OAuthAuditRow {
  id: number;
  at: string;
  event: OAuthAuditEvent;
  client_id: string | null;
  principal_id: string | null;
  grant_id: string | null;
  scopes: string | null;
  detail: string | null;
}

/** Authorization codes live at most this long (OAuth 2.1 recommends ≤ 10 min; the issue asks ≤ 60 s). */
export const CODE_TTL_MS = 60_000;
/** OAuth audit rows kept; older ones are trimmed on insert. */
export const OAUTH_AUDIT_MAX_ROWS = 100_000;

export const ACCESS_TOKEN_PREFIX = "wcoa_";
export const REFRESH_TOKEN_PREFIX = "wcor_";
export const CODE_PREFIX = "wcoc_";

export function sha256(value: string): string {
  return createHash("sha256").update(value, "utf8").digest("hex");
}

/** A fresh code or token: `prefix` and 32 random bytes. */
export function secret(prefix: string): string {
  return prefix + randomBytes(32).toString("base64url");
}

export function parseJsonList(json: string | null): string[] {
  if (json === null) return [];
  try {
    const value: unknown = JSON.parse(json);
    return Array.isArray(value) ? value.filter((v): v is string => typeof v === "string") : [];
  } catch {
    return [];
  }
}

export interface NewGrant {
  client_id: string;
  principal_id: string;
  key_id: string | null;
  scopes: readonly Scope[];
  projects: readonly string[];
  resource: string;
}

export interface IssuedPair {
  access_token: string;
  refresh_token: string;
  access_expires_at: number;
}

export type RefreshOutcome =
  | { ok: true; grant: GrantRow; pair: IssuedPair; scopes: string[]; replayed: boolean }
  | { ok: false; reason: "unknown" | "expired" | "reused" | "revoked" | "other_client" | "scope_widened" };

export type CodeOutcome =
  | { ok: true; grant: GrantRow; pair: IssuedPair }
  | { ok: false; reason: "unknown" | "expired" | "reused" | "other_client" | "redirect_mismatch" | "revoked" };

export interface NewClient {
  client_id: string;
  kind: ClientKind;
  client_name: string | null;
  redirect_uris: string[];
  /** The issuer a dynamic client is registered under; kept as first written. */
  issuer?: string | null;
}

export interface TokenTtls {
  accessMs: number;
  refreshMs: number;
  /** `[oauth] refresh_reuse_grace_secs` in ms; 0: every reuse revokes the family. */
  reuseGraceMs: number;
}
