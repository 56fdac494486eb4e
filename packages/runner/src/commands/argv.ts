/**
 * The `webcodex-runner` argv shared by every command: one pass over the flags, `--config` both the file and,
 * in KEY=VALUE form, a caller config option; usage mistakes are a UsageError.
 */
import { CONFIG_ID_PATTERN } from "@webcodex/protocol";
import { loadConfig, type RunnerConfig } from "../config/config.js";

/** A usage mistake: main prints its message with the usage text and exits 2. */
export class UsageError extends Error {}

export interface Parsed {
  command: string;
  configFile: string | null;
  options: Record<string, string | boolean>;
  flags: Map<string, string | true>;
  positional: string[];
}

const VALUE_FLAGS = new Set(["--config", "-c", "--probe", "--project", "--provider", "--timeout", "--log-level"]);
const BOOL_FLAGS = new Set(["--new-store", "--json", "--help", "-h"]);
const OPTION_ARG = /^([A-Za-z0-9][A-Za-z0-9_.:/-]{0,127})=(.*)$/s;

/** `--config` is both the file and, in KEY=VALUE form, a caller config option (as `-c KEY=VALUE`). */
export function parseArgv(argv: readonly string[]): Parsed {
  const [command = "", ...rest] = argv;
  const parsed: Parsed = { command, configFile: null, options: {}, flags: new Map(), positional: [] };
  for (let i = 0; i < rest.length; i++) {
    const arg = rest[i] as string;
    if (arg === "--") {
      parsed.positional.push(...rest.slice(i + 1));
      break;
    }
    const eq = arg.startsWith("--") ? arg.indexOf("=") : -1;
    const name = eq > 0 ? arg.slice(0, eq) : arg;
    if (BOOL_FLAGS.has(name)) {
      parsed.flags.set(name, true);
    } else if (VALUE_FLAGS.has(name)) {
      const value = eq > 0 ? arg.slice(eq + 1) : rest[++i];
      if (value === undefined) throw new UsageError(`${name} needs a value`);
      const option = OPTION_ARG.exec(value);
      if ((name === "--config" || name === "-c") && option) {
        const key = option[1] as string;
        const raw = option[2] as string;
        if (!CONFIG_ID_PATTERN.test(key)) throw new UsageError(`config option id ${JSON.stringify(key)} is not valid`);
        parsed.options[key] = raw === "true" ? true : raw === "false" ? false : raw;
      } else if (name === "--config") {
        if (parsed.configFile !== null) throw new UsageError("--config FILE given twice");
        parsed.configFile = value;
      } else {
        parsed.flags.set(name, value);
      }
    } else if (arg.startsWith("-") && arg !== "-") {
      throw new UsageError(`unknown option ${arg}`);
    } else {
      parsed.positional.push(arg);
    }
  }
  return parsed;
}

export function flag(parsed: Parsed, name: string): string | undefined {
  const v = parsed.flags.get(name);
  return typeof v === "string" ? v : undefined;
}

/** The config named by `--config FILE` (throws ConfigError, exit 2). */
export async function requireConfig(parsed: Parsed): Promise<RunnerConfig> {
  if (parsed.configFile === null) throw new UsageError("--config FILE is required");
  return loadConfig(parsed.configFile);
}
