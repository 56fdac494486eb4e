/**
 * The shared skeleton of `webcodex task …` and `webcodex session …`: one subcommand per Server
 * tool, each with its own flags plus the global ones, parsed strictly; usage errors name the family.
 */
import { type ParseArgsConfig, parseArgs } from "node:util";
import { CliError } from "./errors.js";

/** Flags every task/session subcommand takes. */
export const SUBCOMMAND_GLOBAL = {
  url: { type: "string" },
  token: { type: "string" },
  json: { type: "boolean" },
  help: { type: "boolean", short: "h" },
} as const satisfies ParseArgsConfig["options"];

export interface SubcommandGlobals {
  url: string | undefined;
  token: string | undefined;
  json: boolean;
}

export type SubcommandValues = Record<string, string | undefined> & {
  config?: string[];
  json?: boolean;
  help?: boolean;
};

/** Helpers bound to one family (`task`, `session`): their errors point at that family's --help. */
export function subcommandFamily(family: string) {
  const usage = (message: string): CliError =>
    new CliError("usage", message, { hint: `Run \`webcodex ${family} --help\` for usage.` });
  return {
    usage,
    /**
     * `null` means: print the family's usage. Otherwise the subcommand's name (a key of `options`), its
     * flag values, positionals and the global flags.
     */
    parse<K extends string>(
      argv: string[],
      options: Record<K, ParseArgsConfig["options"]>,
    ): { name: K; values: SubcommandValues; positionals: string[]; global: SubcommandGlobals } | null {
      const [action, ...rest] = argv;
      if (action === undefined || action === "--help" || action === "-h" || action === "help") return null;
      if (!Object.hasOwn(options, action)) throw usage(`unknown ${family} command "${action}"`);
      const name = action as K;
      let parsed: { values: Record<string, unknown>; positionals: string[] };
      try {
        parsed = parseArgs({ args: rest, options: options[name], allowPositionals: true, strict: true });
      } catch (err) {
        throw usage(err instanceof Error ? (err.message.split("\n")[0] ?? "invalid arguments") : "invalid arguments");
      }
      const values = parsed.values as SubcommandValues;
      if (values.help === true) return null;
      const global = { url: values.url, token: values.token, json: values.json === true };
      return { name, values, positionals: parsed.positionals, global };
    },
    one(positionals: string[], what: string): string {
      if (positionals.length !== 1) throw usage(`expected one ${what}, got ${positionals.length}`);
      return positionals[0] ?? "";
    },
    required(value: string | undefined, flag: string): string {
      if (value === undefined || value.trim() === "") throw usage(`missing ${flag}`);
      return value;
    },
    /** A whole number ≥ `min`; `expects` overrides the message's "a whole number ≥ min". */
    wholeNumber(raw: string | undefined, flag: string, min: number, expects?: string): number | undefined {
      if (raw === undefined) return undefined;
      const n = Number(raw);
      if (!Number.isInteger(n) || n < min) {
        throw usage(`${flag} expects ${expects ?? `a whole number ≥ ${min}`}, got "${raw}"`);
      }
      return n;
    },
  };
}
