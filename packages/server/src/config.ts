/**
 * Server configuration (TOML, startup-owned; restart to change).
 *
 * ```toml
 * [server]
 * host = "127.0.0.1"          # listen address
 * port = 7420                 # 0 = pick a free port (tests)
 * state_dir = ".webcodex/server"   # relative to this file; SQLite + server_secret live here
 * heartbeat_interval_ms = 15000
 * allowed_origins = []        # browser Origins allowed on /mcp besides the Server's own loopback origin
 * cors_origins = []           # browser Origins answered with CORS headers on /mcp (MCP Inspector, web hosts)
 * trusted_proxies = []        # reverse proxies whose X-Forwarded-For / Forwarded names the client
 * rejected_record_max_age_secs = 604800   # records rejected before admission expire after this (7 days)
 * session_max_idle_secs = 7776000          # idle workflow sessions (no run in flight) are deleted after this (90 days)
 * max_connections = 1000      # open sockets at once; past it a new connection gets 503 (keep below `ulimit -n`)
 * allow_insecure_http = false # true: listen on a non-loopback host without TLS (behind a TLS-terminating proxy)
 * public_url = "https://webcodex.example.com"   # OAuth issuer + resource base (required when [oauth] enabled)
 *
 * [server.state]              # optional: where state lives (default: SQLite in state_dir)
 * backend = "postgres"        # several Server instances share one PostgreSQL database
 * url_env = "WEBCODEX_DATABASE_URL"   # the env var holding postgres://user:password@host:port/db
 * pool_size = 10              # connections this instance opens at most
 *
 * [server.cluster]            # optional, PostgreSQL only: how the other instances reach this one
 * listen_port = 7421          # /_wc/ on a listener of its own, never the clients' (default 0: a free port)
 * listen_host = "10.0.0.5"    # that listener's address (default: server.host)
 * advertise_url = "http://10.0.0.5:7421"   # default: http(s)://<listen_host>:<port> of that listener
 * serve_on_client_listener = false   # true: /_wc/ on the clients' listener instead (warned at start)
 * allow_insecure_transport = false   # true: plain http:// between instances on a non-loopback address
 *
 * [server.webhooks]           # optional: signed webhooks (design §18; `webcodex-server webhooks`)
 * allow_loopback_http = false # true: receivers at http://127.0.0.1 / [::1] / localhost (and https to loopback)
 * retry_base_ms = 5000        # the first retry's delay; doubles per attempt (capped, with jitter)
 * disable_after_failures = 100 # a subscription failing this many attempts in a row…
 * disable_after_secs = 432000  # …for at least this long (5 days) is disabled (`webhooks enable` turns it back on)
 *
 * [server.tls]                # optional: terminate TLS here (https:// and wss://)
 * cert_file = "server.crt"    # PEM certificate chain, relative to this file
 * key_file = "server.key"     # PEM private key
 *
 * [oauth]                     # OAuth 2.1 for remote MCP hosts; see the server README, OAuth section
 * enabled = false
 *
 * [[runners]]
 * id = "local"
 * token_sha256 = "<hex sha256 of the runner's bearer token>"   # or token_env = "NAME"
 * projects = ["demo"]          # project ids this runner owns; each project has exactly one runner
 * shared_user_principals = ["alice"]   # optional: while this runner's agents run as its own OS user
 *                                      # (its hello says so), only these principals' runs go to it
 *
 * [[principals]]
 * id = "alice"
 * scopes = ["coding_agent:run", "project:write"]
 * projects = ["demo"]
 * # Optional, for tokens not issued by `webcodex-server token issue`: hex sha256 of bearer tokens
 * # and the fixed scopes they carry (token_scopes ∩ scopes; widening `scopes` never widens them).
 * # token_scopes may hold coding_agent:run only with allow_coding_agent_run = true.
 * # token_sha256 = ["<hex sha256>"]
 * # token_scopes = ["project:read"]
 * # allow_coding_agent_run = false
 * ```
 */
import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import { dirname, resolve } from "node:path";
import { didYouMean, isLoopbackHost, LocalId } from "@webcodex/protocol";
import { parse as parseToml } from "smol-toml";
import { z } from "zod";
import { SCOPES } from "./principals/principal.js";
import { hashToken } from "./principals/tokens.js";

/** Default of `[server] rejected_record_max_age_secs` (runs/record-expiry.ts sweeps with it). */
export const DEFAULT_REJECTED_RECORD_MAX_AGE_SECS = 7 * 24 * 3600;
export const MIN_REJECTED_RECORD_MAX_AGE_SECS = 60;
export const MAX_REJECTED_RECORD_MAX_AGE_SECS = 10 * 365 * 24 * 3600;
/** Default of `[server] session_max_idle_secs`: a session untouched this long, with no run in flight, is deleted. */
export const DEFAULT_SESSION_MAX_IDLE_SECS = 90 * 24 * 3600;
export const MIN_SESSION_MAX_IDLE_SECS = 60;
export const MAX_SESSION_MAX_IDLE_SECS = 10 * 365 * 24 * 3600;

const Hex256 = z.string().regex(/^[0-9a-f]{64}$/, "must be a lowercase hex sha256");
/** A browser origin: scheme://host[:port], nothing else. */
const OriginString = z
  .string()
  .max(255)
  .refine((s) => {
    try {
      const u = new URL(s);
      return (u.protocol === "http:" || u.protocol === "https:") && u.origin === s;
    } catch {
      return false;
    }
  }, "must be an origin like https://app.example (scheme://host[:port], no path or trailing slash)");
const EnvName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]{0,127}$/, "must be an environment variable name");

/** `[server] public_url`: scheme://host[:port], https unless the host is loopback; no path, query or fragment. */
const PublicUrlString = z
  .string()
  .max(255)
  .refine((s) => {
    try {
      const u = new URL(s);
      if (u.username || u.password || u.search || u.hash) return false;
      if (u.pathname !== "/" || !(s === u.origin || s === `${u.origin}/`)) return false;
      return u.protocol === "https:" || (u.protocol === "http:" && isLoopbackHost(u.hostname));
    } catch {
      return false;
    }
  }, "must be an origin like https://mcp.example.com (https unless the host is loopback; no path, query or fragment)");

const RedirectUri = z
  .string()
  .max(2048)
  .refine((s) => {
    try {
      const u = new URL(s);
      return u.hash === "" && u.protocol !== "javascript:" && u.protocol !== "data:";
    } catch {
      return false;
    }
  }, "must be an absolute URL without a fragment");

/**
 * Default `[oauth] app_redirect_schemes`: native MCP hosts whose OAuth redirect uses a scheme of one label
 * (Cursor's `cursor://anysphere.cursor-mcp/oauth/callback`, VS Code's `vscode://`).
 */
export const DEFAULT_APP_REDIRECT_SCHEMES = ["cursor", "vscode", "vscode-insiders"] as const;

/** Default and largest `[oauth] refresh_reuse_grace_secs`. */
export const DEFAULT_REFRESH_REUSE_GRACE_SECS = 30;
export const MAX_REFRESH_REUSE_GRACE_SECS = 300;

/** A proxy address for `[server] trusted_proxies`: an IP address or a CIDR block (what proxy-addr accepts). */
const ProxyAddress = z
  .string()
  .max(64)
  .refine((s) => {
    const [addr, bits, extra] = s.split("/");
    if (extra !== undefined || addr === undefined) return false;
    const family = isIP(addr);
    if (family === 0) return false;
    if (bits === undefined) return true;
    if (!/^\d{1,3}$/.test(bits)) return false;
    return Number(bits) <= (family === 4 ? 32 : 128);
  }, "must be an IP address or CIDR block such as 10.0.0.1, 10.0.0.0/8 or fd00::/8");

/** An operator-registered OAuth client (`[[oauth.clients]]`). */
export const OAuthClientConfigSchema = z
  .object({
    client_id: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/, "must be 1-128 characters of [A-Za-z0-9_.:-]"),
    name: z.string().min(1).max(128),
    redirect_uris: z.array(RedirectUri).min(1).max(16),
  })
  .strict();

/** `[oauth]`: OAuth 2.1 for remote MCP hosts (design §9). Off unless `enabled = true`. */
export const OAuthConfigSchema = z
  .object({
    enabled: z.boolean().default(false),
    access_token_ttl_secs: z.number().int().min(60).max(86_400).default(3600),
    refresh_token_ttl_secs: z
      .number()
      .int()
      .min(3600)
      .max(90 * 86_400)
      .default(30 * 86_400),
    /** Dynamic (RFC 7591) and metadata-document clients kept at most; the oldest unused one makes room. */
    max_dynamic_clients: z.number().int().min(1).max(100_000).default(1000),
    /** Dynamic registrations accepted per client IP per hour. */
    registrations_per_hour: z.number().int().min(1).max(10_000).default(20),
    /** Wrong access keys accepted per client and IP within `key_attempt_window_secs`. */
    max_key_attempts: z.number().int().min(1).max(100).default(5),
    key_attempt_window_secs: z.number().int().min(10).max(86_400).default(900),
    /**
     * DEV ONLY: let client metadata document URLs resolve to loopback addresses (a test or a local
     * client). Private and link-local addresses stay refused.
     */
    dev_allow_loopback_client_metadata: z.boolean().default(false),
    /**
     * A refresh token presented again this long after it was rotated (a retried or concurrent refresh) gets
     * the pair its rotation issued instead of revoking the family; 0 turns the grace off.
     */
    refresh_reuse_grace_secs: z
      .number()
      .int()
      .min(0)
      .max(MAX_REFRESH_REUSE_GRACE_SECS)
      .default(DEFAULT_REFRESH_REUSE_GRACE_SECS),
    /** RFC 7591 dynamic registration at /register (client ID metadata documents are the preferred way). */
    dynamic_registration: z.boolean().default(true),
    /**
     * Single-label private-use redirect schemes of native apps that do not use a reverse-domain scheme
     * (RFC 8252 §7.1), accepted besides https, loopback http and reverse-domain schemes.
     */
    app_redirect_schemes: z
      .array(
        z
          .string()
          .regex(
            /^[a-z][a-z0-9+-]{0,31}$/,
            "must be a URI scheme name (lowercase letters, digits, + and -), without ':'",
          ),
      )
      .max(32)
      .default([...DEFAULT_APP_REDIRECT_SCHEMES]),
    clients: z.array(OAuthClientConfigSchema).max(256).default([]),
  })
  .strict();

/** A principal id: 1-128 characters of [A-Za-z0-9_.:@-], starting with a letter or digit. */
const PrincipalId = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$/, "must be 1-128 characters of [A-Za-z0-9_.:@-]");

/**
 * Most `[[runners]]` one Server configuration declares. A deployment of 10,000 Runners (issue 29 §4, measured
 * by `npm run bench -- --only links`) declares each of them here; each is a few hundred bytes of parsed config.
 */
export const MAX_RUNNERS = 16_384;

/** Most principals one runner's `shared_user_principals` may list. */
export const MAX_SHARED_USER_PRINCIPALS = 4096;

export const RunnerConfigSchema = z
  .object({
    id: LocalId,
    token_sha256: Hex256.optional(),
    token_env: EnvName.optional(),
    projects: z.array(LocalId).max(256).default([]),
    /**
     * When this runner says in `hello` that its agents run as its own OS user (or does not say), only these
     * principals' runs are routed to it; absent: every principal's (design §4.2).
     */
    shared_user_principals: z.array(PrincipalId).max(MAX_SHARED_USER_PRINCIPALS).optional(),
  })
  .strict()
  .refine((r) => (r.token_sha256 === undefined) !== (r.token_env === undefined), {
    message: "exactly one of token_sha256 or token_env is required",
  });

export const PrincipalConfigSchema = z
  .object({
    id: PrincipalId,
    scopes: z.array(z.enum(SCOPES)).max(SCOPES.length).default([]),
    projects: z.array(LocalId).max(256).default([]),
    /**
     * Hex sha256 of bearer tokens declared here rather than issued with `webcodex-server token issue`
     * (issued tokens live in the state DB). They carry `token_scopes` ∩ `scopes`, never `scopes` alone.
     */
    token_sha256: z.array(Hex256).max(64).default([]),
    /** The fixed scopes of the inline `token_sha256` tokens; required when any are declared. */
    token_scopes: z.array(z.enum(SCOPES)).max(SCOPES.length).optional(),
    /** The operator's explicit opt-in for `coding_agent:run` in `token_scopes` (design §6.2). */
    allow_coding_agent_run: z.boolean().default(false),
  })
  .strict()
  .refine((p) => p.token_sha256.length === 0 || p.token_scopes !== undefined, {
    message: "token_sha256 needs an explicit token_scopes list (the scopes those tokens carry)",
    path: ["token_scopes"],
  })
  .refine((p) => !p.token_scopes?.includes("coding_agent:run") || p.allow_coding_agent_run, {
    message: "token_scopes may include coding_agent:run only with allow_coding_agent_run = true",
    path: ["token_scopes"],
  });

/** Listen addresses that name no one host: a peer cannot reach this instance there (`[server.cluster]`). */
const UNSPECIFIED_HOSTS = new Set(["0.0.0.0", "::", "[::]"]);

/** Default `[server] max_connections`: below the common 1024 open-file limit, with room for the database. */
export const DEFAULT_MAX_CONNECTIONS = 1000;
/** Largest `[server.state] pool_size`: each connection is a PostgreSQL backend process. */
export const MAX_STATE_POOL_SIZE = 100;
/** Default `[server.state] pool_size` (state/engine-postgres.ts POSTGRES_POOL_SIZE, kept equal by a test). */
export const DEFAULT_STATE_POOL_SIZE = 10;
/** `[server.webhooks] retry_base_ms` bounds (webhooks/worker.ts DEFAULT_RETRY_BASE_MS is the default). */
export const MIN_WEBHOOK_RETRY_BASE_MS = 50;
export const MAX_WEBHOOK_RETRY_BASE_MS = 10 * 60 * 1000;
/** `[server.webhooks] disable_after_failures` bounds and default. */
export const MAX_WEBHOOK_DISABLE_AFTER_FAILURES = 100_000;
export const DEFAULT_WEBHOOK_DISABLE_AFTER_FAILURES = 100;
/** `[server.webhooks] disable_after_secs` bounds and default (5 days). */
export const MAX_WEBHOOK_DISABLE_AFTER_SECS = 90 * 24 * 3600;
export const DEFAULT_WEBHOOK_DISABLE_AFTER_SECS = 5 * 24 * 3600;

export const ServerConfigSchema = z
  .object({
    server: z
      .object({
        host: z.string().min(1).max(255).default("127.0.0.1"),
        port: z.number().int().min(0).max(65535).default(7420),
        state_dir: z.string().min(1).max(4096).default(".webcodex/server"),
        heartbeat_interval_ms: z.number().int().min(100).max(600_000).default(15_000),
        /** Origin header values accepted on /mcp (exact, e.g. "https://app.example"); see mcp/gate.ts. */
        allowed_origins: z.array(OriginString).max(64).default([]),
        /**
         * Browser origins answered with CORS headers on /mcp (preflight without auth); each is also an allowed
         * Origin. Empty: no CORS headers, as before.
         */
        cors_origins: z.array(OriginString).max(64).default([]),
        /**
         * Reverse proxies whose X-Forwarded-For / Forwarded header names the client (rate limits, audit, logs).
         * Empty: the socket address is the client, and forwarded headers are ignored.
         */
        trusted_proxies: z.array(ProxyAddress).max(64).default([]),
        /** The issuer and resource base for OAuth (https, or http on a loopback host); see oauth/README section. */
        public_url: PublicUrlString.optional(),
        /** Age after which a record rejected before admission is deleted (runs/record-expiry.ts). */
        rejected_record_max_age_secs: z
          .number()
          .int()
          .min(MIN_REJECTED_RECORD_MAX_AGE_SECS)
          .max(MAX_REJECTED_RECORD_MAX_AGE_SECS)
          .default(DEFAULT_REJECTED_RECORD_MAX_AGE_SECS),
        /** Idle age after which a workflow session with no run in flight is deleted (sessions/store.ts). */
        session_max_idle_secs: z
          .number()
          .int()
          .min(MIN_SESSION_MAX_IDLE_SECS)
          .max(MAX_SESSION_MAX_IDLE_SECS)
          .default(DEFAULT_SESSION_MAX_IDLE_SECS),
        /** Sockets open at once (MCP clients, Runners, anything); past it a new one is answered 503 and closed. */
        max_connections: z.number().int().min(8).max(65_536).default(DEFAULT_MAX_CONNECTIONS),
        /** Listen on a non-loopback host without [server.tls] (a reverse proxy terminates TLS). */
        allow_insecure_http: z.boolean().default(false),
        tls: z
          .object({
            cert_file: z.string().min(1).max(4096),
            key_file: z.string().min(1).max(4096),
          })
          .strict()
          .optional(),
        /** Where the Server keeps its state (state/open.ts): the SQLite file in state_dir, or PostgreSQL. */
        state: z
          .object({
            backend: z.enum(["sqlite", "postgres"], { error: 'must be "sqlite" or "postgres"' }).default("sqlite"),
            /** The environment variable that holds the PostgreSQL URL (never the URL, nor a password, in the file). */
            url_env: z
              .string()
              .regex(/^[A-Za-z_][A-Za-z0-9_]{0,127}$/, "must be an environment variable name")
              .default("WEBCODEX_DATABASE_URL"),
            /** Connections this instance's pool opens at most (PostgreSQL). */
            pool_size: z.number().int().min(1).max(MAX_STATE_POOL_SIZE).default(DEFAULT_STATE_POOL_SIZE),
          })
          .strict()
          .prefault({}),
        /** Routing between instances on one PostgreSQL state (cluster/). */
        cluster: z
          .object({
            /** The base URL the other instances send this one the link requests it holds (no path). */
            advertise_url: z
              .string()
              .max(2048)
              .regex(/^https?:\/\/[^\s/?#]+$/, "must be http(s)://host[:port] with no path, query or fragment")
              .optional(),
            /**
             * A listener of its own for the instances' requests to each other (`/_wc/`): a saturated Server
             * accepts one connection per turn of its event loop, and a peer's fresh connection must not
             * queue behind the clients' handshakes (design §14). 0 picks a free port (tests).
             */
            listen_port: z.number().int().min(0).max(65_535).optional(),
            /** That listener's address; default `server.host`. */
            listen_host: z.string().min(1).max(255).optional(),
            /**
             * Serve `/_wc/` on the clients' listener (reachable through the load balancer) instead of a
             * listener of its own: an explicit opt-in, warned about at start.
             */
            serve_on_client_listener: z.boolean({ error: "must be a boolean" }).default(false),
            /** Accept plain http:// to and from instances on non-loopback addresses (as the Runner's ws:// rule). */
            allow_insecure_transport: z.boolean({ error: "must be a boolean" }).default(false),
          })
          .strict()
          .prefault({}),
        /** Signed webhooks (webhooks/): where receivers may be, how soon a failed attempt is retried. */
        webhooks: z
          .object({
            allow_loopback_http: z.boolean({ error: "must be a boolean" }).default(false),
            retry_base_ms: z.number().int().min(MIN_WEBHOOK_RETRY_BASE_MS).max(MAX_WEBHOOK_RETRY_BASE_MS).default(5000),
            disable_after_failures: z
              .number()
              .int()
              .min(1)
              .max(MAX_WEBHOOK_DISABLE_AFTER_FAILURES)
              .default(DEFAULT_WEBHOOK_DISABLE_AFTER_FAILURES),
            disable_after_secs: z
              .number()
              .int()
              .min(0)
              .max(MAX_WEBHOOK_DISABLE_AFTER_SECS)
              .default(DEFAULT_WEBHOOK_DISABLE_AFTER_SECS),
          })
          .strict()
          .prefault({}),
      })
      .strict()
      .prefault({}),
    runners: z.array(RunnerConfigSchema).max(MAX_RUNNERS).default([]),
    oauth: OAuthConfigSchema.optional(),
    principals: z.array(PrincipalConfigSchema).max(4096).default([]),
  })
  .strict();

export type RunnerConfigRaw = z.infer<typeof RunnerConfigSchema>;
export type PrincipalConfig = z.infer<typeof PrincipalConfigSchema>;

export type OAuthClientConfig = z.infer<typeof OAuthClientConfigSchema>;

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
