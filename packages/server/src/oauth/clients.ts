/**
 * The three kinds of OAuth client, behind the SDK's `OAuthRegisteredClientsStore`:
 *
 * - **operator**: `[[oauth.clients]]` in the Server config, synced into the store at start;
 * - **cimd**: an https `client_id` URL whose metadata document is fetched (client-metadata.ts)
 *   and cached in the store for CIMD_CACHE_TTL_MS;
 * - **dynamic**: RFC 7591 registration (rate-limited by the SDK handler, bounded here by
 *   `max_dynamic_clients`; the oldest unprovisioned client without a live grant makes room). A
 *   dynamic client id is bound to the issuer that minted it (SEP-2352): once `public_url` changes,
 *   it is refused and the client registers again. Rows from before the binding carry no issuer and
 *   stay accepted.
 *
 * Every client is public (`token_endpoint_auth_method: none`): PKCE S256 protects the code, and
 * there is no client secret to store. Registration never sets `allow_coding_agent_run`; only the
 * operator command does.
 */
import type { OAuthRegisteredClientsStore } from "@modelcontextprotocol/sdk/server/auth/clients.js";
import { InvalidClientMetadataError, TooManyRequestsError } from "@modelcontextprotocol/sdk/server/auth/errors.js";
import type { OAuthClientInformationFull } from "@modelcontextprotocol/sdk/shared/auth.js";
import type { Logger } from "pino";
import type { OAuthSettings } from "../config.js";
import { isLoopbackHost } from "../config.js";
import {
  CIMD_CACHE_TTL_MS,
  ClientMetadataError,
  fetchClientMetadata,
  isMetadataUrl,
  MAX_CLIENT_NAME_CHARS,
  MAX_REDIRECT_URIS,
} from "./client-metadata.js";
import { type ClientRow, type OAuthStore, parseJsonList } from "./store.js";

/** A failed metadata fetch is remembered this long, so one bad URL cannot make us fetch on every request. */
export const CIMD_FAILURE_TTL_MS = 30_000;
const CIMD_FAILURES_MAX = 1024;
export const MAX_REDIRECT_URI_CHARS = 2048;

export type ResolvedClient =
  | { ok: true; client: OAuthClientInformationFull; row: ClientRow }
  | { ok: false; reason: string };

/** RFC 8252 §7.3 loopback redirect hosts (the SDK's redirectUriMatches relaxes only their port). */
const LOOPBACK_REDIRECT_HOSTS = new Set(["127.0.0.1", "localhost", "[::1]"]);

/** A private-use scheme named by a reverse domain (RFC 8252 §7.1): two or more dot-separated labels. */
const REVERSE_DOMAIN_SCHEME = /^[a-z][a-z0-9-]*(\.[a-z0-9-]+)+$/;

/** Whether an http(s) redirect URI names a loopback host (127.0.0.1, localhost, [::1]). */
export function isLoopbackRedirect(u: URL): boolean {
  return LOOPBACK_REDIRECT_HOSTS.has(u.hostname);
}

/**
 * Whether a redirect URI is acceptable for a registered client (OAuth 2.1 §2.3.1 / RFC 8252): https, http on a
 * loopback host, or a native app's private-use scheme — a reverse-domain one (`com.example.app:/callback`,
 * RFC 8252 §7.1) or one of the single-label schemes the operator allows (`[oauth] app_redirect_schemes`).
 * Every other scheme (`ftp:`, `ws:`, `ms-msdt:`, `view-source:`, …) is refused: a redirect to it would hand the
 * code to whatever the person's system opens for that scheme.
 */
export function redirectUriProblem(uri: string, appSchemes: readonly string[]): string | null {
  if (uri.length > MAX_REDIRECT_URI_CHARS) return `longer than ${MAX_REDIRECT_URI_CHARS} characters`;
  let u: URL;
  try {
    u = new URL(uri);
  } catch {
    return "not an absolute URL";
  }
  if (u.hash !== "") return "has a fragment";
  if (u.protocol === "https:") return null;
  if (u.protocol === "http:") return isLoopbackHost(u.hostname) ? null : "http is allowed only for loopback hosts";
  const scheme = u.protocol.slice(0, -1);
  if (REVERSE_DOMAIN_SCHEME.test(scheme) || appSchemes.includes(scheme)) return null;
  return (
    `the scheme "${scheme.slice(0, 32)}:" is not allowed: use https, http on a loopback host, or a private-use ` +
    "reverse-domain scheme such as com.example.app:/callback (an operator can allow a native app's own scheme " +
    "with [oauth] app_redirect_schemes)"
  );
}

function infoOf(row: ClientRow): OAuthClientInformationFull {
  return {
    client_id: row.client_id,
    redirect_uris: parseJsonList(row.redirect_uris),
    token_endpoint_auth_method: "none",
    grant_types: ["authorization_code", "refresh_token"],
    response_types: ["code"],
    ...(row.client_name !== null ? { client_name: row.client_name } : {}),
  };
}

export class OAuthClients implements OAuthRegisteredClientsStore {
  readonly #store: OAuthStore;
  readonly #settings: OAuthSettings;
  readonly #logger: Logger;
  readonly #ca: string | undefined;
  readonly #inFlight = new Map<string, Promise<ResolvedClient>>();
  readonly #failures = new Map<string, { reason: string; until: number }>();

  constructor(opts: { store: OAuthStore; settings: OAuthSettings; logger: Logger; ca?: string | undefined }) {
    this.#store = opts.store;
    this.#settings = opts.settings;
    this.#logger = opts.logger;
    this.#ca = opts.ca;
  }

  /**
   * `[[oauth.clients]]` → store rows (name and redirect URIs follow the config; provisioning stays as it was).
   * Called once before the OAuth endpoints are served (createOAuth).
   */
  async syncOperatorClients(): Promise<void> {
    for (const c of this.#settings.clients) {
      const existing = await this.#store.client(c.client_id);
      if (existing && existing.kind !== "operator") {
        this.#logger.warn({ client_id: c.client_id }, "oauth: configured client id is already used by another client");
        continue;
      }
      await this.#store.upsertClient({
        client_id: c.client_id,
        kind: "operator",
        client_name: c.name,
        redirect_uris: c.redirect_uris,
      });
    }
  }

  async getClient(clientId: string): Promise<OAuthClientInformationFull | undefined> {
    const r = await this.resolve(clientId);
    return r.ok ? r.client : undefined;
  }

  /** The client, or why it cannot be used (shown on the authorize error page). */
  async resolve(clientId: string): Promise<ResolvedClient> {
    if (clientId.length === 0 || clientId.length > MAX_REDIRECT_URI_CHARS)
      return { ok: false, reason: "unknown client_id" };
    const row = await this.#store.client(clientId);
    if (row?.revoked_at) return { ok: false, reason: "this client was revoked by the operator" };
    if (row?.kind === "dynamic" && row.issuer !== null && row.issuer !== this.#settings.issuer) {
      return { ok: false, reason: "this client was registered with another issuer; register it again" };
    }
    if (!isMetadataUrl(clientId)) {
      return row ? { ok: true, client: infoOf(row), row } : { ok: false, reason: "unknown client_id" };
    }
    const fresh = row?.fetched_at ? Date.now() - Date.parse(row.fetched_at) < CIMD_CACHE_TTL_MS : false;
    if (row && fresh) return { ok: true, client: infoOf(row), row };
    const failed = this.#failures.get(clientId);
    if (failed && failed.until > Date.now()) return { ok: false, reason: failed.reason };
    let pending = this.#inFlight.get(clientId);
    if (!pending) {
      pending = this.#fetch(clientId).finally(() => this.#inFlight.delete(clientId));
      this.#inFlight.set(clientId, pending);
    }
    return pending;
  }

  async #fetch(clientId: string): Promise<ResolvedClient> {
    try {
      const doc = await fetchClientMetadata(clientId, {
        allowLoopback: this.#settings.devAllowLoopbackClientMetadata,
        ca: this.#ca,
      });
      for (const uri of doc.redirect_uris) {
        const problem = redirectUriProblem(uri, this.#settings.appRedirectSchemes);
        if (problem) throw new ClientMetadataError(`client metadata document: redirect_uri ${problem}`);
      }
      const admitted = await this.#store.upsertRegistered(
        { client_id: clientId, kind: "cimd", client_name: doc.client_name, redirect_uris: doc.redirect_uris },
        this.#settings.maxDynamicClients,
      );
      if (!admitted) throw this.#full();
      const row = await this.#store.client(clientId);
      if (!row || row.revoked_at) return { ok: false, reason: "this client was revoked by the operator" };
      return { ok: true, client: infoOf(row), row };
    } catch (err) {
      const reason =
        err instanceof ClientMetadataError || err instanceof TooManyRequestsError
          ? err.message
          : "client metadata could not be loaded";
      // The URL's host and path are the client's public identity; the reason never holds a secret.
      this.#logger.warn({ client_id: clientId.slice(0, 256), reason }, "oauth: client metadata refused");
      if (this.#failures.size >= CIMD_FAILURES_MAX) this.#failures.clear();
      this.#failures.set(clientId, { reason, until: Date.now() + CIMD_FAILURE_TTL_MS });
      return { ok: false, reason };
    }
  }

  /** max_dynamic_clients is reached and no held client can make room (store.upsertRegistered). */
  #full(): TooManyRequestsError {
    return new TooManyRequestsError("this server holds as many registered clients as it allows; try again later");
  }

  async registerClient(
    client: Omit<OAuthClientInformationFull, "client_id" | "client_id_issued_at">,
  ): Promise<OAuthClientInformationFull> {
    const full = client as OAuthClientInformationFull;
    const uris = full.redirect_uris.map(String);
    if (uris.length === 0 || uris.length > MAX_REDIRECT_URIS) {
      throw new InvalidClientMetadataError(`redirect_uris must list 1-${MAX_REDIRECT_URIS} URIs`);
    }
    for (const uri of uris) {
      const problem = redirectUriProblem(uri, this.#settings.appRedirectSchemes);
      if (problem) throw new InvalidClientMetadataError(`redirect_uris: a URI is not acceptable (${problem})`);
    }
    for (const g of full.grant_types ?? []) {
      if (g !== "authorization_code" && g !== "refresh_token") {
        throw new InvalidClientMetadataError(`grant_types: only authorization_code and refresh_token are supported`);
      }
    }
    const name = typeof full.client_name === "string" ? full.client_name.slice(0, MAX_CLIENT_NAME_CHARS) : null;
    const clientId = full.client_id ?? `dyn_${crypto.randomUUID()}`;
    const admitted = await this.#store.upsertRegistered(
      { client_id: clientId, kind: "dynamic", client_name: name, redirect_uris: uris, issuer: this.#settings.issuer },
      this.#settings.maxDynamicClients,
    );
    if (!admitted) throw this.#full();
    const row = await this.#store.client(clientId);
    if (!row) throw new InvalidClientMetadataError("registration failed");
    return { ...infoOf(row), client_id_issued_at: Math.floor(Date.now() / 1000) };
  }
}
