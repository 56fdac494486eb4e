/**
 * `--config KEY=VALUE` pairs, shared by `webcodex run` (args.ts) and `webcodex task create` (task-args.ts):
 * `true`/`false` become booleans, every other value stays a string; a pair without a key or given twice is
 * a usage error.
 */
import { CliError } from "./errors.js";
import type { ConfigValue } from "./wire.js";

export function parseConfigPairs(pairs: readonly string[]): Record<string, ConfigValue> {
  const config: Record<string, ConfigValue> = {};
  for (const pair of pairs) {
    const eq = pair.indexOf("=");
    if (eq <= 0) throw usage(`--config expects KEY=VALUE, got "${pair}"`);
    const key = pair.slice(0, eq);
    const raw = pair.slice(eq + 1);
    if (Object.hasOwn(config, key)) throw usage(`--config ${key} given twice`);
    config[key] = raw === "true" ? true : raw === "false" ? false : raw;
  }
  return config;
}

function usage(message: string): CliError {
  return new CliError("usage", message, { hint: "Run `webcodex --help` for usage." });
}
