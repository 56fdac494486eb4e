/**
 * @webcodex/runner public surface: the config loader, the run lifecycle
 * behind the RunService seam, and the pieces a daemon or a test composes.
 * The CLI lives in main.ts (bin: webcodex-runner).
 */

export { checkCallerKeys, type SequencingResult, sequenceConfig, snapshotConfig } from "./acp/config-sequencing.js";
export {
  ACP_PROTOCOL_VERSION,
  AcpClientConnection,
  type AcpHooks,
  DEFAULT_MAX_ACP_MESSAGE_BYTES,
  type RequestOutcome,
  type TransportFault,
} from "./acp/session.js";
export { type ProbeResult, probeAgent } from "./commands/probe.js";
export { formatVerdict, KNOWN_AGENTS, probeVerdict, type Verdict } from "./commands/probe-verdict.js";
export {
  type AcpConfig,
  type AgentConfig,
  ConfigError,
  loadConfig,
  type ProjectConfig,
  parseConfig,
  type RunnerConfig,
  type ServerConfig,
} from "./config/config.js";
export { EventNormalizer, relativizePath } from "./events/normalize.js";
export { REDACTED, Redactor } from "./events/redactor.js";
export { EventRing, type RingLimits, type RingRead } from "./events/ring.js";
export { createLogger, type Logger, silentLogger } from "./logger.js";
export {
  type AgentChild,
  groupAlive,
  resolveChildEnv,
  SpawnError,
  spawnAgent,
  type TreeCleanup,
} from "./process/spawn.js";
export { RunManager, type RunManagerOptions } from "./runs/manager.js";
export { rowToSummary } from "./runs/record.js";
export type {
  HelloBody,
  RunCancelResult,
  RunService,
  RunStartOutcome,
  RunStartRequest,
  RunSyncResult,
  RunUpdateListener,
} from "./runs/service.js";
export type { AdmissionRow, DispatchRow, DispatchStore, TerminalUpdate } from "./store/types.js";
