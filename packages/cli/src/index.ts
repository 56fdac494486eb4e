export { runCli, VERSION } from "./cli.js";
export type { CliContext } from "./context.js";
export { EXIT, exitCodeForState } from "./exit-codes.js";
export { followRun } from "./follow.js";
export * from "./render.js";
export * from "./render-summary.js";
export type { RunsClient } from "./server-client.js";
export { McpRunsClient } from "./server-client.js";
export * from "./wire.js";
