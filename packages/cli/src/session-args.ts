/**
 * Parsing of `webcodex session …` (Workflow Sessions, DESIGN §11): one
 * subcommand per Server tool.
 */
import { type ParseArgsConfig, parseArgs } from "node:util";
import { CliError } from "./errors.js";
import type { TaskGlobals } from "./task-args.js";

export const SESSION_USAGE = `Workflow sessions (provenance and handoff; they grant no authority):
  webcodex session create --project ID --title T
  webcodex session update SESSION_ID [--handoff TEXT] [--goal TEXT] [--expected-version N]   (TEXT "-" reads stdin)
  webcodex session show SESSION_ID [--after SEQ]
Use with runs: webcodex run --session SESSION_ID (record) / --context-session SESSION_ID (start from its handoff).
`;

export type SessionAction =
  | { action: "create"; project: string; title: string }
  | {
      action: "update";
      sessionId: string;
      handoff: string | undefined;
      goal: string | undefined;
      expectedVersion: number | undefined;
    }
  | { action: "show"; sessionId: string; after: number | undefined };

const GLOBAL = {
  url: { type: "string" },
  token: { type: "string" },
  json: { type: "boolean" },
  help: { type: "boolean", short: "h" },
} as const satisfies ParseArgsConfig["options"];

const OPTIONS = {
  create: { ...GLOBAL, project: { type: "string" }, title: { type: "string" } },
  update: { ...GLOBAL, handoff: { type: "string" }, goal: { type: "string" }, "expected-version": { type: "string" } },
  show: { ...GLOBAL, after: { type: "string" } },
} as const satisfies Record<SessionAction["action"], ParseArgsConfig["options"]>;

function usage(message: string): CliError {
  return new CliError("usage", message, { hint: "Run `webcodex session --help` for usage." });
}

function wholeNumber(raw: string | undefined, flag: string, min: number): number | undefined {
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw usage(`${flag} expects a whole number ≥ ${min}, got "${raw}"`);
  return n;
}

/** `null` means: print the session usage. */
export function parseSessionCommand(argv: string[]): { global: TaskGlobals; session: SessionAction } | null {
  const [action, ...rest] = argv;
  if (action === undefined || action === "--help" || action === "-h" || action === "help") return null;
  if (!Object.hasOwn(OPTIONS, action)) throw usage(`unknown session command "${action}"`);
  const name = action as SessionAction["action"];
  let parsed: { values: Record<string, string | boolean | undefined>; positionals: string[] };
  try {
    const options: ParseArgsConfig["options"] = OPTIONS[name];
    parsed = parseArgs({ args: rest, options, allowPositionals: true, strict: true }) as typeof parsed;
  } catch (err) {
    throw usage(err instanceof Error ? (err.message.split("\n")[0] ?? "invalid arguments") : "invalid arguments");
  }
  const v = parsed.values as Record<string, string | undefined> & { json?: boolean; help?: boolean };
  if (v.help === true) return null;
  const global = { url: v.url, token: v.token, json: v.json === true };
  const p = parsed.positionals;
  const one = (what: string) => {
    if (p.length !== 1) throw usage(`expected one ${what}, got ${p.length}`);
    return p[0] ?? "";
  };
  switch (name) {
    case "create": {
      if (p.length > 0) throw usage("session create takes no positional arguments");
      if (v.project === undefined || v.project.trim() === "") throw usage("missing --project ID");
      if (v.title === undefined || v.title.trim() === "") throw usage("missing --title T");
      return { global, session: { action: "create", project: v.project, title: v.title } };
    }
    case "update": {
      const sessionId = one("SESSION_ID");
      if (v.handoff === undefined && v.goal === undefined) throw usage("give --handoff, --goal or both");
      if (v.handoff === "-" && v.goal === "-") throw usage("only one of --handoff and --goal can read stdin");
      return {
        global,
        session: {
          action: "update",
          sessionId,
          handoff: v.handoff,
          goal: v.goal,
          expectedVersion: wholeNumber(v["expected-version"], "--expected-version", 1),
        },
      };
    }
    case "show":
      return {
        global,
        session: { action: "show", sessionId: one("SESSION_ID"), after: wholeNumber(v.after, "--after", 0) },
      };
    default: {
      const never: never = name;
      return never;
    }
  }
}
