/**
 * The Server's configuration as it runs (ServerConfig), built from the file (config-file.ts: the TOML's shape,
 * bounds and defaults) with relative paths resolved, tokens hashed and cross-key rules checked.
 */
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { didYouMean, isLoopbackHost } from "@webcodex/protocol";
import { parse as parseToml } from "smol-toml";
import type { z } from "zod";
import { type OAuthClientConfig, type PrincipalConfig, ServerConfigSchema } from "./config-file.js";
import { hashToken } from "./principals/tokens.js";

/** Listen addresses that name no one host: a peer cannot reach this instance there (`[server.cluster]`). */
const UNSPECIFIED_HOSTS = new Set(["0.0.0.0", "::", "[::]"]);

/** `[oauth]` after validation; present only when enabled. */
export interface OAuthSettings {
  /** `[server] public_url` without a trailing slash: the issuer. */
  issuer: string;
  /** `${issuer}/mcp`: the only resource tokens are issued for. */
  resource: string;
  accessTokenTtlSecs: number;
  refreshTokenTtlSecs: number;
  maxDynamicClients: number;
  registrationsPerHour: number;
  maxKeyAttempts: number;
  keyAttemptWindowSecs: number;
  devAllowLoopbackClientMetadata: boolean;
  /** `[oauth] refresh_reuse_grace_secs`. */
  refreshReuseGraceSecs: number;
  /** `[oauth] dynamic_registration`: /register is served and advertised. */
  dynamicRegistration: boolean;
  /** `[oauth] app_redirect_schemes`: single-label private-use redirect schemes accepted (without ':'). */
  appRedirectSchemes: readonly string[];
  clients: OAuthClientConfig[];
}

export interface RunnerBinding {
  id: string;
  /** sha256 of the bearer token, 32 bytes. */
  tokenHash: Buffer;
  projects: string[];
  /**
   * `shared_user_principals`: the only principals whose runs go to this runner while its agents share its
   * OS user (its hello says so, or says nothing); null: no such restriction.
   */
  sharedUserPrincipals: ReadonlySet<string> | null;
}

export interface ServerConfig {
  /** Absolute path of the file this came from, or null when built in memory. */
  file: string | null;
  host: string;
  port: number;
  /** Absolute. */
  stateDir: string;
  heartbeatIntervalMs: number;
  /** Origins allowed on /mcp besides the Server's own loopback origin. */
  allowedOrigins: string[];
  /** `[server] cors_origins`: origins answered with CORS headers on /mcp. */
  corsOrigins: string[];
  /** `[server] trusted_proxies`: addresses/CIDRs whose forwarded headers are believed. */
  trustedProxies: string[];
  /** `[server] rejected_record_max_age_secs`: when records rejected before admission expire. */
  rejectedRecordMaxAgeSecs: number;
  /** `[server] session_max_idle_secs`: when idle workflow sessions are deleted. */
  sessionMaxIdleSecs: number;
  maxConnections: number;
  allowInsecureHttp: boolean;
  /** Absolute paths of the PEM certificate chain and key when the Server terminates TLS itself. */
  tls: { certFile: string; keyFile: string } | null;
  /** `[server.state]`: the SQLite file in stateDir, or a PostgreSQL URL read from `urlEnv` at start. */
  state: { backend: "sqlite" | "postgres"; urlEnv: string; poolSize: number };
  /**
   * `[server.cluster]`: the URL other instances reach this one on (null = the URL of the listener serving
   * `/_wc/`), and that listener (null: the clients' one, by `serve_on_client_listener`, or no cluster at all);
   * whether plain http:// between instances on non-loopback addresses is accepted.
   */
  cluster: {
    advertiseUrl: string | null;
    listen: { host: string; port: number } | null;
    onClientListener: boolean;
    allowInsecureTransport: boolean;
  };
  runners: RunnerBinding[];
  principals: PrincipalConfig[];
  /** `[server] public_url` without a trailing slash, or null. */
  publicUrl: string | null;
  /** OAuth for remote MCP hosts, or null when `[oauth] enabled` is not true. */
  oauth: OAuthSettings | null;
  /** project id -> runner id (each project bound to exactly one runner). */
  projectRunner: ReadonlyMap<string, string>;
  /** `[server.webhooks]`: loopback receivers allowed (http too); the first retry's delay; when to disable. */
  webhooks: { allowLoopbackHttp: boolean; retryBaseMs: number; disableAfterFailures: number; disableAfterMs: number };
}

export class ConfigError extends Error {
  override readonly name = "ConfigError";
}

/** True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost); shared with the Runner. */
export { isLoopbackHost };

/** Hex sha256 of a bearer token, the form `token_sha256` pins (the token store's hash). */
export function sha256Hex(text: string): string {
  return hashToken(text);
}

/** Validate a parsed TOML document. `baseDir` resolves relative paths; `env` supplies token_env values. */
export function buildServerConfig(
  doc: unknown,
  opts: { file: string | null; baseDir: string; env?: NodeJS.ProcessEnv },
): ServerConfig {
  const where = opts.file ?? "<config>";
  const parsed = ServerConfigSchema.safeParse(doc);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const path = issue ? issue.path.map(String).join(".") : "";
    const keys =
      issue?.code === "unrecognized_keys"
        ? ` (unknown key ${issue.keys.map((k) => `${k}${didYouMean(ServerConfigSchema, issue.path, k)}`).join(", ")})`
        : "";
    throw new ConfigError(`${where}: ${path || "(root)"}: ${issue?.message ?? "invalid"}${keys}`);
  }
  const cfg = parsed.data;
  const env = opts.env ?? process.env;
  const runnerIds = new Set<string>();
  const projectRunner = new Map<string, string>();
  const runners: RunnerBinding[] = [];
  for (const [i, r] of cfg.runners.entries()) {
    if (runnerIds.has(r.id)) throw new ConfigError(`${where}: runners[${i}].id: duplicate runner id "${r.id}"`);
    runnerIds.add(r.id);
    let hex = r.token_sha256;
    if (hex === undefined && r.token_env !== undefined) {
      const token = env[r.token_env];
      if (!token)
        throw new ConfigError(`${where}: runners[${i}].token_env: environment variable ${r.token_env} is not set`);
      hex = sha256Hex(token);
    }
    for (const p of r.projects) {
      const other = projectRunner.get(p);
      if (other !== undefined) {
        throw new ConfigError(`${where}: runners[${i}].projects: project "${p}" is already bound to runner "${other}"`);
      }
      projectRunner.set(p, r.id);
    }
    runners.push({
      id: r.id,
      tokenHash: Buffer.from(hex ?? "", "hex"),
      projects: [...r.projects],
      sharedUserPrincipals: r.shared_user_principals === undefined ? null : new Set(r.shared_user_principals),
    });
  }
  const principalIds = new Set<string>();
  for (const [i, p] of cfg.principals.entries()) {
    if (principalIds.has(p.id))
      throw new ConfigError(`${where}: principals[${i}].id: duplicate principal id "${p.id}"`);
    principalIds.add(p.id);
  }
  for (const [i, r] of cfg.runners.entries()) {
    const unknown = (r.shared_user_principals ?? []).filter((id) => !principalIds.has(id));
    if (unknown.length > 0) {
      throw new ConfigError(
        `${where}: runners[${i}].shared_user_principals: ${unknown
          .slice(0, 8)
          .map((id) => `"${id}"`)
          .join(
            ", ",
          )} ${unknown.length === 1 ? "is not a configured principal" : "are not configured principals"} ([[principals]] id)`,
      );
    }
  }
  const clusterListen = clusterListenerOf(cfg.server, where);
  const publicUrl = cfg.server.public_url === undefined ? null : new URL(cfg.server.public_url).origin;
  let oauth: OAuthSettings | null = null;
  if (cfg.oauth?.enabled) {
    if (publicUrl === null) {
      throw new ConfigError(
        `${where}: server.public_url: required when oauth.enabled = true (the issuer and /mcp base)`,
      );
    }
    const clientIds = new Set<string>();
    for (const [i, c] of cfg.oauth.clients.entries()) {
      if (clientIds.has(c.client_id)) {
        throw new ConfigError(`${where}: oauth.clients[${i}].client_id: duplicate client id "${c.client_id}"`);
      }
      clientIds.add(c.client_id);
    }
    oauth = {
      issuer: publicUrl,
      resource: `${publicUrl}/mcp`,
      accessTokenTtlSecs: cfg.oauth.access_token_ttl_secs,
      refreshTokenTtlSecs: cfg.oauth.refresh_token_ttl_secs,
      maxDynamicClients: cfg.oauth.max_dynamic_clients,
      registrationsPerHour: cfg.oauth.registrations_per_hour,
      maxKeyAttempts: cfg.oauth.max_key_attempts,
      keyAttemptWindowSecs: cfg.oauth.key_attempt_window_secs,
      devAllowLoopbackClientMetadata: cfg.oauth.dev_allow_loopback_client_metadata,
      refreshReuseGraceSecs: cfg.oauth.refresh_reuse_grace_secs,
      dynamicRegistration: cfg.oauth.dynamic_registration,
      appRedirectSchemes: cfg.oauth.app_redirect_schemes,
      clients: cfg.oauth.clients,
    };
  }
  return {
    file: opts.file,
    host: cfg.server.host,
    port: cfg.server.port,
    stateDir: resolve(opts.baseDir, cfg.server.state_dir),
    heartbeatIntervalMs: cfg.server.heartbeat_interval_ms,
    allowedOrigins: [...cfg.server.allowed_origins],
    corsOrigins: [...cfg.server.cors_origins],
    trustedProxies: [...cfg.server.trusted_proxies],
    rejectedRecordMaxAgeSecs: cfg.server.rejected_record_max_age_secs,
    sessionMaxIdleSecs: cfg.server.session_max_idle_secs,
    maxConnections: cfg.server.max_connections,
    allowInsecureHttp: cfg.server.allow_insecure_http,
    tls: cfg.server.tls
      ? {
          certFile: resolve(opts.baseDir, cfg.server.tls.cert_file),
          keyFile: resolve(opts.baseDir, cfg.server.tls.key_file),
        }
      : null,
    state: {
      backend: cfg.server.state.backend,
      urlEnv: cfg.server.state.url_env,
      poolSize: cfg.server.state.pool_size,
    },
    cluster: {
      advertiseUrl: cfg.server.cluster.advertise_url ?? null,
      listen: clusterListen,
      onClientListener: cfg.server.state.backend === "postgres" && cfg.server.cluster.serve_on_client_listener,
      allowInsecureTransport: cfg.server.cluster.allow_insecure_transport,
    },
    runners,
    principals: cfg.principals,
    publicUrl,
    oauth,
    projectRunner,
    webhooks: {
      allowLoopbackHttp: cfg.server.webhooks.allow_loopback_http,
      retryBaseMs: cfg.server.webhooks.retry_base_ms,
      disableAfterFailures: cfg.server.webhooks.disable_after_failures,
      disableAfterMs: cfg.server.webhooks.disable_after_secs * 1000,
    },
  };
}

/**
 * `[server.cluster]`'s listener for the instances' requests to each other (design §14): on a PostgreSQL state
 * a listener of its own (`listen_port`, default 0: a free port, advertised through the directory), unless
 * `serve_on_client_listener = true`; null otherwise. Refuses what cannot work: listen keys without PostgreSQL,
 * both a listen port and the client listener, an advertise_url without the fixed port it would name, an
 * unspecified address without advertise_url, and plain http:// to a non-loopback address without
 * `allow_insecure_transport`.
 */
function clusterListenerOf(
  server: z.infer<typeof ServerConfigSchema>["server"],
  where: string,
): ServerConfig["cluster"]["listen"] {
  const c = server.cluster;
  const port = c.listen_port;
  const postgres = server.state.backend === "postgres";
  if (!postgres) {
    if (port !== undefined || c.listen_host !== undefined) {
      throw new ConfigError(
        `${where}: server.cluster.listen_port: only with [server.state] backend = "postgres" (one instance has no peers)`,
      );
    }
    return null;
  }
  if (c.serve_on_client_listener && (port !== undefined || c.listen_host !== undefined)) {
    throw new ConfigError(
      `${where}: server.cluster.serve_on_client_listener: true serves /_wc/ on the clients' listener; ` +
        "remove listen_port and listen_host, or set it to false",
    );
  }
  if (port !== undefined && port !== 0 && port === server.port) {
    throw new ConfigError(`${where}: server.cluster.listen_port: must differ from server.port (${server.port})`);
  }
  if (!c.serve_on_client_listener && (port === undefined || port === 0) && c.advertise_url !== undefined) {
    throw new ConfigError(
      `${where}: server.cluster.listen_port: required with advertise_url (the instances' own listener, on the port ` +
        "advertise_url names); or set serve_on_client_listener = true to serve /_wc/ on the clients' listener",
    );
  }
  const host = c.serve_on_client_listener ? server.host : (c.listen_host ?? server.host);
  if (c.advertise_url === undefined && UNSPECIFIED_HOSTS.has(host)) {
    throw new ConfigError(
      `${where}: server.cluster.advertise_url: required when ${c.serve_on_client_listener ? "server.host" : "the listener of server.cluster"} is "${host}" on a PostgreSQL ` +
        "state: the other instances forward link requests to this URL and cannot reach an unspecified address " +
        '(e.g. advertise_url = "http://10.0.0.5:7421")',
    );
  }
  const advertised = c.advertise_url !== undefined ? new URL(c.advertise_url) : null;
  const scheme = advertised?.protocol ?? (server.tls ? "https:" : "http:");
  const peerHost = advertised?.hostname ?? host;
  if (scheme === "http:" && !isLoopbackHost(peerHost.replace(/^\[|\]$/g, "")) && !c.allow_insecure_transport) {
    throw new ConfigError(
      `${where}: server.cluster: the other instances would reach this one over plain http:// at "${peerHost}", not a ` +
        "loopback address; requests between instances carry prompts. Set [server.tls] (or an https:// " +
        "advertise_url), or set [server.cluster] allow_insecure_transport = true on a private network you trust",
    );
  }
  return c.serve_on_client_listener ? null : { host, port: port ?? 0 };
}

export function parseServerConfig(
  text: string,
  opts: { file: string | null; baseDir: string; env?: NodeJS.ProcessEnv },
) {
  let doc: unknown;
  try {
    doc = parseToml(text);
  } catch (err) {
    const msg = err instanceof Error ? err.message.split("\n")[0] : "invalid TOML";
    throw new ConfigError(`${opts.file ?? "<config>"}: not valid TOML: ${msg}`);
  }
  return buildServerConfig(doc, opts);
}

export function loadServerConfig(file: string, env?: NodeJS.ProcessEnv): ServerConfig {
  const abs = resolve(file);
  let text: string;
  try {
    text = readFileSync(abs, "utf8");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? "unreadable";
    throw new ConfigError(`${abs}: cannot read config (${code})`);
  }
  return parseServerConfig(text, { file: abs, baseDir: dirname(abs), ...(env ? { env } : {}) });
}
