export * from "./config.js";
export * from "./identity.js";
export * from "./observe-token.js";
export * from "./registry.js";
export * from "./run-mirror.js";
export * from "./runner-hub.js";
export * from "./runs.js";
export * from "./runs-api.js";
export {
  type HttpHandler,
  type McpHandlerFactory,
  type McpMount,
  type McpMountContext,
  type RunningServer,
  type StartServerOptions,
  startServer,
  TEST_DELAY_ENV,
} from "./server.js";
export * from "./state-store.js";
