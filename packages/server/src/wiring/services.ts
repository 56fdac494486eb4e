/**
 * `buildServices`: every service of the Server, built in dependency order, each registering its close on the
 * teardown list (teardown.ts) as it is built — the state dir's lock and the state DB first (so they close last),
 * then the run core and its timers, the Runner hub, the MCP front end (mcp.ts) and the operator console.
 * `server.ts` builds the listeners and routes requests to what this returns.
 */
import { randomBytes } from "node:crypto";
import type { Logger } from "pino";
import { clientAddressResolver } from "../client-address.js";
import type { ServerConfig } from "../config.js";
import { type ConsoleMount, createConsole } from "../console/http.js";
import { ConsoleSessions } from "../console/sessions.js";
import { ConsoleReader } from "../console/snapshot.js";
import {
  activeServerFailpoint,
  invalidServerFailpointValue,
  SERVER_FAILPOINT_ENV,
  serverFailpointEffect,
} from "../failpoints.js";
import { RunnerHub } from "../link/hub.js";
import { StateLeaseStore } from "../link/lease-store.js";
import { PRESENCE_REFRESH_MS, PresenceStore } from "../link/presence.js";
import { Registry } from "../link/registry.js";
import { RunnerTokenStore } from "../link/runner-tokens.js";
import { OperatorReadClients } from "../oauth/operator-read.js";
import { OAuthStore } from "../oauth/store.js";
import { createKeyIdentifier, keyPrincipal, TokenStore } from "../principals/tokens.js";
import { reconcileAtStart } from "../runs/reconcile.js";
import { startRejectedRecordExpiry } from "../runs/record-expiry.js";
import { Runs } from "../runs/runs.js";
import { lockStateDir } from "../state/lock.js";
import { openState } from "../state/open.js";
import type { StateStore } from "../state/store.js";
import { WebhookOutbox } from "../webhooks/outbox.js";
import { Webhooks } from "../webhooks/service.js";
import { Listeners } from "./listeners.js";
import { buildMcp, type McpMount } from "./mcp.js";
import type { Teardown } from "./teardown.js";

export const TEST_DELAY_ENV = "WEBCODEX_TEST_HOOK_DELAY_AFTER_RESOLVE_MS";

export interface ServicesOptions {
  config: ServerConfig;
  logger: Logger;
  env: NodeJS.ProcessEnv;
  /** How long a run.start waits for the Runner's answer before its outcome counts as unknown. */
  startTimeoutMs?: number;
  /** Build the MCP front end (`/mcp`, and the OAuth paths with `[server.oauth]`). */
  mcp: boolean;
  /** The clients' listener speaks TLS (the console's cookies are `Secure`). */
  tls: boolean;
}

export interface Services {
  /** Names this instance in link lease holders and in the cluster directory (cluster/directory.ts). */
  instanceId: string;
  store: StateStore;
  /** The webhook outbox's delivery worker (webhooks/): started once the Server listens. */
  webhooks: Webhooks;
  registry: Registry;
  presence: PresenceStore;
  runs: Runs;
  hub: RunnerHub;
  mcp: McpMount | null;
  console: ConsoleMount;
  /** Where `server.ts` registers each listener it makes (listeners.ts). */
  listeners: Listeners;
}

/** Build every service; on a throw, whatever was built is on `teardown` (the caller runs it). */
export async function buildServices(opts: ServicesOptions, teardown: Teardown): Promise<Services> {
  const { config, logger, env } = opts;
  // SQLite: one Server per state dir, held until close (or the process's end); see state/lock.ts.
  // PostgreSQL: several instances share the database by design, so nothing is locked.
  if (config.state.backend === "sqlite") {
    const lock = lockStateDir(config.stateDir);
    teardown.add("state dir lock", () => lock.release());
  }
  const store = await openState(config, env);
  teardown.add("state store", () => store.close());
  if (store.migrated.length > 0) logger.info({ versions: store.migrated }, "state DB schema migrated");
  // Every service below has stopped by the time this runs: a request still in flight is cut off here.
  const listeners = new Listeners();
  teardown.add("connections left open", () => listeners.dropConnections());
  const armed = activeServerFailpoint();
  if (armed) logger.warn({ failpoint: armed }, `${SERVER_FAILPOINT_ENV} is set: ${serverFailpointEffect()}`);
  if (invalidServerFailpointValue()) logger.warn(`${SERVER_FAILPOINT_ENV} names no failpoint; ignored`);
  const presence = new PresenceStore(store.engine, (err) =>
    logger.error({ err: (err as Error).message }, "runner presence not written (state DB)"),
  );
  const registry = new Registry(config, presence);
  const presenceTimer = setInterval(() => void presence.seen(registry.liveIds()), PRESENCE_REFRESH_MS);
  presenceTimer.unref();
  teardown.add("runner presence refresh", () => clearInterval(presenceTimer));
  const delay = Number(env[TEST_DELAY_ENV] ?? 0);
  const runs = new Runs({
    store,
    registry,
    logger: logger.child({ c: "runs" }),
    ...(Number.isFinite(delay) && delay > 0 ? { testDelayAfterResolveMs: delay } : {}),
    ...(opts.startTimeoutMs !== undefined ? { startTimeoutMs: opts.startTimeoutMs } : {}),
  });
  // Before anything changes a record: the webhook events of a change are written in its transaction (webhooks/).
  const webhooks = new Webhooks(store, config.webhooks, logger.child({ c: "webhooks" }));
  teardown.add("webhooks", () => webhooks.close());
  await reconcileAtStart(store, logger);
  const stopExpiry = startRejectedRecordExpiry(store, config.rejectedRecordMaxAgeSecs, logger);
  teardown.add("rejected-record expiry", stopExpiry);
  const instanceId = randomBytes(12).toString("base64url");
  const hub = new RunnerHub({
    bindings: config.runners,
    logger: logger.child({ c: "hub" }),
    listener: runs,
    heartbeatIntervalMs: config.heartbeatIntervalMs,
    serverInstanceId: instanceId,
    tokens: new RunnerTokenStore(store.engine),
    leaseStore: new StateLeaseStore(store.engine),
  });
  teardown.add("runner hub", () => hub.close());
  // The run core is the hub's listener: it stops (waking every waiting observe) before the links close, so
  // the links' goodbyes do no work.
  teardown.add("run core", () => runs.close());
  const mcp = opts.mcp ? await buildMcp({ runs, admission: runs, config, logger, store, webhooks }, teardown) : null;
  const console_ = buildConsole(store, config, logger, runs, presence, opts.tls);
  teardown.add("operator console", () => console_.close());
  return { instanceId, store, registry, presence, runs, hub, mcp, console: console_, listeners, webhooks };
}

/** The operator console (console/http.ts) over this Server's state DB, keys and run mirrors. */
function buildConsole(
  store: StateStore,
  config: ServerConfig,
  logger: Logger,
  runs: Runs,
  presence: PresenceStore,
  tls: boolean,
): ConsoleMount {
  const tokens = new TokenStore(store.engine);
  const oauth = new OAuthStore(store.engine);
  const operatorClients = new OperatorReadClients(oauth);
  const webhookOutbox = new WebhookOutbox(store.engine);
  return createConsole({
    config,
    logger: logger.child({ c: "console" }),
    sessions: new ConsoleSessions(store.engine),
    reader: new ConsoleReader({
      state: store,
      oauth,
      config,
      mirrors: runs.mirrors,
      followEvents: (runId, timeoutMs) => runs.followEvents(runId, timeoutMs),
      changedFiles: (runId, timeoutMs) => runs.changedFilesForOperator(runId, timeoutMs),
      presence: () => presence.rows(),
      operatorClients: () => operatorClients.all(),
    }),
    identifyKey: createKeyIdentifier(tokens, config.principals),
    keyPrincipal: keyPrincipal(tokens, config.principals),
    revokeGrant: (grantId, reason) => oauth.revokeGrant(grantId, reason),
    redeliverWebhook: (eventId, actor) => webhookOutbox.redeliver(eventId, Date.now(), actor),
    secure: tls || (config.publicUrl?.startsWith("https:") ?? false),
    clientAddress: clientAddressResolver(config.trustedProxies),
  });
}
