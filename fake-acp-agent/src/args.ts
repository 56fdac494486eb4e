import { parseArgs } from "node:util";
import { CONFIG_OPTION_IDS, type ConfigOptionId, isConfigOptionId } from "./config-options.js";

/** Start-up behaviour chosen by CLI flags (prompt behaviour is chosen by the prompt text). */
export interface AgentOptions {
  /** Append one JSON line per received `session/prompt` and per notable event. */
  ledgerFile: string | undefined;
  /** Write the sorted names of the process environment here at start-up. */
  envNamesFile: string | undefined;
  /** `process.exit(1)` upon receiving `initialize`, without answering. */
  exitDuringInitialize: boolean;
  /** protocolVersion to answer `initialize` with (default: the SDK's PROTOCOL_VERSION). */
  protocolVersion: number | undefined;
  /** Never answer this request. */
  hangOn: "initialize" | "session_new" | undefined;
  /** Answer `session/new` with a JSON-RPC error. */
  failSessionNew: boolean;
  /** Advertise a terminal login and an `authenticate` method, and refuse `session/new` with ACP auth_required. */
  authRequired: boolean;
  /** Config options `session/new` advertises, in flag order. Empty: no `configOptions`. */
  configOptions: ConfigOptionId[];
  /** Delay before answering `session/new`. */
  sessionNewDelayMs: number;
  /** agentInfo.name answered to `initialize` (default fake-acp-agent), to mimic a real adapter. */
  agentName: string | undefined;
  /** Values of the `mode` config option (the first is current), to mimic a real adapter's mode names. */
  modeValues: string[];
  /** Session modes `session/new` returns (the first is current), as agents without config options do. */
  sessionModes: string[];
  /** Which continuation methods `initialize` advertises and serves: `loadSession`, `sessionCapabilities.resume`. */
  continuation: Continuation;
  /** Where sessions persist (one JSON file per session id), so a later process can load/resume them. */
  sessionDir: string | undefined;
  /** Write an `initialize` ledger line (with the pid) for every `initialize` request. */
  ledgerInitialize: boolean;
}

export const CONTINUATIONS = ["none", "load", "resume", "both"] as const;
export type Continuation = (typeof CONTINUATIONS)[number];
/** Env fallback for `--session-dir` (a flag wins). */
export const SESSION_DIR_ENV = "FAKE_ACP_SESSION_DIR";

/** A bad command line; main prints the message to stderr and exits 2. */
export class UsageError extends Error {
  override readonly name = "UsageError";
}

function nonNegativeInt(flag: string, raw: string): number {
  if (!/^\d+$/.test(raw)) throw new UsageError(`${flag} expects a non-negative integer, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

function integer(flag: string, raw: string): number {
  if (!/^-?\d+$/.test(raw)) throw new UsageError(`${flag} expects an integer, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

export function parseCli(argv: readonly string[], env: NodeJS.ProcessEnv = {}): AgentOptions {
  let values: ReturnType<typeof parse>["values"];
  try {
    values = parse(argv).values;
  } catch (error) {
    throw new UsageError(error instanceof Error ? error.message : String(error));
  }

  let hangOn: AgentOptions["hangOn"];
  if (values["hang-on"] !== undefined) {
    const raw = values["hang-on"];
    if (raw !== "initialize" && raw !== "session_new") {
      throw new UsageError(`--hang-on expects initialize or session_new, got ${JSON.stringify(raw)}`);
    }
    hangOn = raw;
  }

  const configOptions: ConfigOptionId[] = [];
  if (values["config-options"] !== undefined) {
    for (const raw of values["config-options"].split(",")) {
      const id = raw.trim();
      if (id === "") continue;
      if (!isConfigOptionId(id)) {
        throw new UsageError(
          `--config-options: unknown option ${JSON.stringify(id)} (known: ${CONFIG_OPTION_IDS.join(", ")})`,
        );
      }
      if (!configOptions.includes(id)) configOptions.push(id);
    }
  }

  const list = (flag: string, raw: string | undefined): string[] => {
    const items = (raw ?? "")
      .split(",")
      .map((v) => v.trim())
      .filter((v) => v !== "");
    for (const v of items) {
      if (!/^[A-Za-z0-9_.:-]{1,64}$/.test(v)) throw new UsageError(`${flag}: ${JSON.stringify(v)} is not a valid id`);
    }
    return items;
  };

  const continuation = values.continuation ?? "none";
  if (!(CONTINUATIONS as readonly string[]).includes(continuation)) {
    throw new UsageError(`--continuation expects ${CONTINUATIONS.join(", ")}, got ${JSON.stringify(continuation)}`);
  }
  const rawDir = values["session-dir"] ?? env[SESSION_DIR_ENV];
  const sessionDir = rawDir === undefined || rawDir === "" ? undefined : rawDir;
  if (continuation !== "none" && sessionDir === undefined) {
    throw new UsageError(`--continuation ${continuation} needs --session-dir (or ${SESSION_DIR_ENV})`);
  }

  return {
    continuation: continuation as Continuation,
    sessionDir,
    ledgerInitialize: values["ledger-initialize"] ?? false,
    agentName: values["agent-name"],
    modeValues: list("--mode-values", values["mode-values"]),
    sessionModes: list("--session-modes", values["session-modes"]),
    ledgerFile: values.ledger,
    envNamesFile: values["env-names"],
    exitDuringInitialize: values["exit-during-initialize"] ?? false,
    protocolVersion:
      values["protocol-version"] === undefined ? undefined : integer("--protocol-version", values["protocol-version"]),
    hangOn,
    failSessionNew: values["fail-session-new"] ?? false,
    authRequired: values["auth-required"] ?? false,
    configOptions,
    sessionNewDelayMs:
      values["session-new-delay-ms"] === undefined
        ? 0
        : nonNegativeInt("--session-new-delay-ms", values["session-new-delay-ms"]),
  };
}

function parse(argv: readonly string[]) {
  return parseArgs({
    args: [...argv],
    strict: true,
    allowPositionals: false,
    options: {
      ledger: { type: "string" },
      "env-names": { type: "string" },
      "exit-during-initialize": { type: "boolean" },
      "protocol-version": { type: "string" },
      "hang-on": { type: "string" },
      "fail-session-new": { type: "boolean" },
      "auth-required": { type: "boolean" },
      "config-options": { type: "string" },
      "session-new-delay-ms": { type: "string" },
      "agent-name": { type: "string" },
      "mode-values": { type: "string" },
      "session-modes": { type: "string" },
      continuation: { type: "string" },
      "session-dir": { type: "string" },
      "ledger-initialize": { type: "boolean" },
    },
  });
}
