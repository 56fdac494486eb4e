/**
 * @webcodex/runner public surface: the config loader, the run lifecycle
 * behind the RunService seam, and the pieces a daemon or a test composes.
 * The CLI lives in main.ts (bin: webcodex-runner).
 */
export {
  ACP_PROTOCOL_VERSION,
  AcpClientConnection,
  type AcpHooks,
  DEFAULT_MAX_ACP_MESSAGE_BYTES,
  type RequestOutcome,
  type TransportFault,
} from "./acp-session.js";
export {
  type AcpConfig,
  type AgentConfig,
  ConfigError,
  loadConfig,
  type ProjectConfig,
  parseConfig,
  type RunnerConfig,
  type ServerConfig,
} from "./config.js";
export { checkCallerKeys, type SequencingResult, sequenceConfig, snapshotConfig } from "./config-sequencing.js";
export type { AdmissionRow, DispatchRow, DispatchStore, TerminalUpdate } from "./dispatch-store-types.js";
export { EventRing, type RingLimits, type RingRead } from "./event-ring.js";
export { EventNormalizer, REDACTED, Redactor, relativizePath } from "./events.js";
export { createLogger, type Logger, silentLogger } from "./logger.js";
export { type ProbeResult, probeAgent } from "./probe.js";
export { RunManager, type RunManagerOptions, rowToSummary } from "./run-manager.js";
export type {
  HelloBody,
  RunCancelResult,
  RunService,
  RunStartOutcome,
  RunStartRequest,
  RunSyncResult,
  RunUpdateListener,
} from "./run-service.js";
export { type AgentChild, groupAlive, resolveChildEnv, SpawnError, spawnAgent, type TreeCleanup } from "./spawn.js";
