import { isIP } from "node:net";
import { isLoopbackHost, LocalId } from "@webcodex/protocol";
import { z } from "zod";
import { SCOPES } from "./principals/principal.js";

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
