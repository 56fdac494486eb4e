/**
 * The MCP front end's services, built for `/mcp`: the token store, the audit log, OAuth, Workflow Sessions, managed
 * tasks and the tool modules, handed built to `createMcpHttpHandler` (mcp/http.ts). Token hashes
 * (`principal_tokens`) and audit rows (`mcp_audit`) live in the Server's state database next to the admission
 * records. Each service registers its close on the teardown list as it is built (teardown.ts).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { isLoopbackHost } from "@webcodex/protocol";
import type { Logger } from "pino";
import { clientAddressResolver } from "../client-address.js";
import type { ServerConfig } from "../config.js";
import { StateAuditLog } from "../mcp/audit.js";
import { createMcpHttpHandler } from "../mcp/http.js";
import { RunTasks } from "../mcp/run-tasks.js";
import { createOAuth } from "../oauth/index.js";
import { OAUTH_TEST_CLOCK_ENV, oauthClock, oauthTestClockSkew } from "../oauth/test-clock.js";
import type { Scope } from "../principals/principal.js";
import { createAuthenticator, TokenStore } from "../principals/tokens.js";
import type { RunAdmission, RunsApi } from "../runs/api.js";
import { ObserveLimits } from "../runs/observe-limits.js";
import { SessionService } from "../sessions/service.js";
import { SessionStore } from "../sessions/store.js";
import { SessionTools } from "../sessions/tools.js";
import type { StateStore } from "../state/store.js";
import { TaskService } from "../tasks/service.js";
import { TaskStore } from "../tasks/store.js";
import { TaskTools } from "../tasks/tools.js";
import type { ToolModule } from "../tools/contract.js";
import type { Webhooks } from "../webhooks/service.js";
import { WebhookTools } from "../webhooks/tools.js";
import type { Teardown } from "./teardown.js";

export type HttpHandler = (req: IncomingMessage, res: ServerResponse) => void | Promise<void>;

/** What `server.ts` routes to the MCP front end. */
export interface McpMount {
  handle: HttpHandler;
  /** Paths besides /mcp this mount answers (the OAuth endpoints when OAuth is on). */
  owns?(path: string): boolean;
}

export interface McpServices {
  runs: RunsApi;
  /** The run core's one admission path (agent tasks derive their run ids themselves). */
  admission: RunAdmission;
  config: ServerConfig;
  logger: Logger;
  store: StateStore;
  /** The task changes' webhook events are written in their transactions (webhooks/). */
  webhooks?: Webhooks;
}

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

export async function buildMcp(
  { runs, admission, config, logger, store, webhooks }: McpServices,
  teardown: Teardown,
): Promise<McpMount> {
  const log = logger.child({ c: "mcp" });
  // Start-up catch-up and prunes run in the background (each idempotent; no request depends on them); each
  // service's close awaits its own, with the evidence writes still queued, before the state DB closes.
  const inBackground = (work: Promise<void>, what: string): Promise<void> =>
    work.catch((err: unknown) => log.error({ err: err instanceof Error ? err.name : typeof err }, what));

  const tokens = new TokenStore(store.engine);
  // Until it listens (PostgreSQL), every token verification reads the token's row.
  const following = inBackground(tokens.followRevocations(), "token revocation notices not followed");
  teardown.add("principal tokens", async () => {
    await following;
    tokens.close();
  });
  const audit = new StateAuditLog(store.engine, {
    onError: (err) => log.error({ err: err instanceof Error ? err.name : typeof err }, "audit row not written"),
  });
  teardown.add("mcp audit log", () => audit.close());
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
  const sessionsStarted = inBackground(sessions.start(), "workflow session start-up catch-up failed");
  teardown.add("workflow sessions", async () => {
    await sessionsStarted;
    await sessions.settled();
  });
  const tasks = new TaskService({
    tasks: new TaskStore(store.engine),
    records: store,
    admission,
    logger: logger.child({ c: "tasks" }),
    ...(webhooks ? { onChange: webhooks.onTaskChange } : {}),
  });
  const tasksStarted = inBackground(tasks.start(), "closed-task prune at start failed");
  teardown.add("agent tasks", async () => {
    await tasksStarted;
    await tasks.stop();
  });
  const toolModules: ToolModule[] = [new SessionTools(sessions), new TaskTools(tasks, sessions)];
  // A principal's own webhook subscriptions (design §18), behind webhooks:write.
  if (webhooks) toolModules.push(new WebhookTools(webhooks.subscriptions, config.webhooks));
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
  teardown.add("mcp handler", () => handler.close());
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
  };
}
