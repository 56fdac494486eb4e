export * from "./config.js";
export * from "./config-file.js";
export * from "./link/hub.js";
export * from "./link/registry.js";
export * from "./runs/api.js";
export * from "./runs/identity.js";
export * from "./runs/mirror.js";
export * from "./runs/observe-token.js";
export * from "./runs/runs.js";
export {
  type HttpHandler,
  type McpMount,
  type RunningServer,
  type StartServerOptions,
  startServer,
  TEST_DELAY_ENV,
} from "./server.js";
export * from "./state/store.js";
