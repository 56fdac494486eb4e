/**
 * The MCP front end as the Server mounts it: `startServer` (via main.ts)
 * calls `createMcpHandler` with the run core and the state store, and routes
 * every `/mcp` request to the returned handler. Token hashes
 * (`principal_tokens`) and audit rows (`mcp_audit`) live in the Server's
 * SQLite state database next to the admission records.
 */
import { SqliteAuditLog } from "./audit.js";
import { createMcpHttpHandler } from "./mcp-http.js";
import { ObserveLimits } from "./observe-limits.js";
import type { McpHandlerFactory, McpMount } from "./server.js";
import { createAuthenticator, TokenStore } from "./tokens.js";

export const createMcpHandler: McpHandlerFactory = ({ runs, config, logger, store }): McpMount => {
  const log = logger.child({ c: "mcp" });
  const audit = new SqliteAuditLog(store.db, {
    onError: (err) => log.error({ err: err instanceof Error ? err.name : typeof err }, "audit row not written"),
  });
  const tokens = new TokenStore(store.db);
  const handler = createMcpHttpHandler({
    runs,
    audit,
    logger: log,
    authenticate: createAuthenticator(tokens, config.principals),
    observeLimits: new ObserveLimits(),
    allowedOrigins: config.allowedOrigins,
    listenHost: config.host,
  });
  return {
    handle: handler,
    close: async () => {
      await handler.close();
      audit.close();
    },
  };
};
