/**
 * The MCP front end as the Server mounts it: `startServer` (via main.ts)
 * calls `createMcpHandler` with the run core and the state store, and routes
 * every `/mcp` request to the returned handler. Token hashes
 * (`principal_tokens`) and audit rows (`mcp_audit`) live in the Server's
 * state database (its engine, state/engine.ts) next to the admission records.
 */
import { isLoopbackHost } from "@webcodex/protocol";
import type { Logger } from "pino";
import { clientAddressResolver } from "../client-address.js";
import { createOAuth } from "../oauth/index.js";
import { OAUTH_TEST_CLOCK_ENV, oauthClock, oauthTestClockSkew } from "../oauth/test-clock.js";
import type { Scope } from "../principals/principal.js";
import { createAuthenticator, TokenStore } from "../principals/tokens.js";
import { ObserveLimits } from "../runs/observe-limits.js";
import type { McpHandlerFactory, McpMount } from "../server.js";
import { SessionService } from "../sessions/service.js";
import { SessionStore } from "../sessions/store.js";
import { SessionTools } from "../sessions/tools.js";
import { TaskService } from "../tasks/service.js";
import { TaskStore } from "../tasks/store.js";
import { TaskTools } from "../tasks/tools.js";
import type { ToolModule } from "../tools/contract.js";
import { StateAuditLog } from "./audit.js";
import { createMcpHttpHandler } from "./http.js";
import { RunTasks } from "./run-tasks.js";

/** The OAuth clock, with the test-only skew (test-clock.ts) refused off loopback and logged when armed. */
function checkedOAuthClock(host: string, log: Logger): () => number {
  const { skewMs, invalid } = oauthTestClockSkew();
  if (invalid !== null) log.warn(`${OAUTH_TEST_CLOCK_ENV} is not a whole number of ms in range; ignored`);
  if (skewMs > 0) {
    if (!isLoopbackHost(host))
      throw new Error(`${OAUTH_TEST_CLOCK_ENV} is test-only; refusing to start on non-loopback host ${host}`);
    log.warn({ skewMs }, `TEST HOOK: ${OAUTH_TEST_CLOCK_ENV} is set: OAuth codes and tokens expire early`);
  }
  return oauthClock();
}

export const createMcpHandler: McpHandlerFactory = async ({
  runs,
  admission,
  config,
  logger,
  store,
}): Promise<McpMount> => {
  const log = logger.child({ c: "mcp" });
  const audit = new StateAuditLog(store.engine, {
    onError: (err) => log.error({ err: err instanceof Error ? err.name : typeof err }, "audit row not written"),
  });
  const tokens = new TokenStore(store.engine);
  const staticAuth = createAuthenticator(tokens, config.principals);
  const clientAddress = clientAddressResolver(config.trustedProxies);
  const oauth = config.oauth
    ? await createOAuth({
        settings: config.oauth,
        engine: store.engine,
        tokens,
        principals: config.principals,
        logger: logger.child({ c: "oauth" }),
        clock: checkedOAuthClock(config.host, log),
        clientAddress,
      })
    : null;
  const sessions = new SessionService(
    new SessionStore(store.engine),
    store,
    logger.child({ c: "sessions" }),
    config.sessionMaxIdleSecs,
  );
  // Start-up catch-up and prunes run in the background (each idempotent; no request depends on them) and
  // are awaited on close, with the evidence writes still queued, before the state DB closes.
  const background: Promise<void>[] = [];
  const inBackground = (work: Promise<void>, what: string) =>
    background.push(
      work.catch((err: unknown) => log.error({ err: err instanceof Error ? err.name : typeof err }, what)),
    );
  inBackground(sessions.start(), "workflow session start-up catch-up failed");
  // Until it listens (PostgreSQL), every token verification reads the token's row.
  inBackground(tokens.followRevocations(), "token revocation notices not followed");
  const toolModules: ToolModule[] = [new SessionTools(sessions)];
  if (admission) {
    const tasks = new TaskService({
      tasks: new TaskStore(store.engine),
      records: store,
      admission,
      logger: logger.child({ c: "tasks" }),
    });
    inBackground(tasks.start(), "closed-task prune at start failed");
    toolModules.push(new TaskTools(tasks, sessions));
  }
  const handler = createMcpHttpHandler({
    runs,
    audit,
    logger: log,
    // Static tokens are checked exactly as without OAuth; OAuth access tokens have their own prefix.
    authenticate: oauth ? async (token) => (await oauth.authenticate(token)) ?? (await staticAuth(token)) : staticAuth,
    observeLimits: new ObserveLimits(),
    toolModules,
    startHooks: sessions.startHooks(),
    runTasks: new RunTasks({ serverSecret: store.serverSecret, runs, records: store }),
    allowedOrigins: config.allowedOrigins,
    corsOrigins: config.corsOrigins,
    clientAddress,
    listenHost: config.host,
    ...(oauth
      ? {
          unauthorizedChallenge: oauth.unauthorizedChallenge,
          insufficientScope: {
            check: (principal, tools) => oauth.insufficientScope(principal, tools),
            challenge: (scopes) => oauth.insufficientScopeChallenge(scopes as Scope[]),
          },
        }
      : {}),
  });
  return {
    handle: (req, res) => {
      const path = (req.url ?? "/").split("?")[0] ?? "/";
      if (oauth?.owns(path)) {
        oauth.handle(req, res);
        return;
      }
      return handler(req, res);
    },
    ...(oauth ? { owns: oauth.owns } : {}),
    close: async () => {
      await handler.close();
      await Promise.all(background);
      await sessions.settled();
      await audit.close();
      tokens.close();
    },
  };
};
