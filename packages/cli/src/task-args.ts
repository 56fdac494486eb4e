/**
 * Parsing of `webcodex task …` (the managed path, DESIGN §10). Kept apart
 * from args.ts: one subcommand per Server tool, each with its own flags.
 */
import { type ParseArgsConfig, parseArgs } from "node:util";
import { parseConfigPairs } from "./args.js";
import { CliError } from "./errors.js";
import type { ConfigValue } from "./wire.js";

export const TASK_USAGE = `Managed tasks (the Server keeps ownership across host restarts):
  webcodex task create --project ID [--title T] [--key K] "INSTRUCTION"   (INSTRUCTION "-" reads stdin)
  webcodex task attempt TASK_ID --assignee NAME [--lease SECS] [--renew ATTEMPT_REF] [--supersede RUN_ID]
  webcodex task run --project ID --provider ID --ref ATTEMPT_REF [--timeout SECS] [--config K=V]...
  webcodex task reconcile TASK_ID [--attempt ATTEMPT_ID]
  webcodex task show TASK_ID
  webcodex task close TASK_ID --outcome succeeded|failed|abandoned
`;

export interface TaskGlobals {
  url: string | undefined;
  token: string | undefined;
  json: boolean;
}

export type TaskAction =
  | { action: "create"; project: string; title: string | undefined; key: string | undefined; instruction: string }
  | {
      action: "attempt";
      taskId: string;
      assignee: string;
      leaseSecs: number | undefined;
      renew: string | undefined;
      supersede: string | undefined;
    }
  | {
      action: "run";
      project: string;
      provider: string;
      ref: string;
      timeoutSecs: number | undefined;
      config: Record<string, ConfigValue>;
    }
  | { action: "reconcile"; taskId: string; attemptId: string | undefined }
  | { action: "show"; taskId: string }
  | { action: "close"; taskId: string; outcome: string };

const GLOBAL = {
  url: { type: "string" },
  token: { type: "string" },
  json: { type: "boolean" },
  help: { type: "boolean", short: "h" },
} as const satisfies ParseArgsConfig["options"];

const OPTIONS = {
  create: { ...GLOBAL, project: { type: "string" }, title: { type: "string" }, key: { type: "string" } },
  attempt: {
    ...GLOBAL,
    assignee: { type: "string" },
    lease: { type: "string" },
    renew: { type: "string" },
    supersede: { type: "string" },
  },
  run: {
    ...GLOBAL,
    project: { type: "string" },
    provider: { type: "string" },
    ref: { type: "string" },
    timeout: { type: "string" },
    config: { type: "string", multiple: true },
  },
  reconcile: { ...GLOBAL, attempt: { type: "string" } },
  show: GLOBAL,
  close: { ...GLOBAL, outcome: { type: "string" } },
} as const satisfies Record<TaskAction["action"], ParseArgsConfig["options"]>;

const OUTCOMES = ["succeeded", "failed", "abandoned"];

function usage(message: string): CliError {
  return new CliError("usage", message, { hint: "Run `webcodex task --help` for usage." });
}

function required(value: string | undefined, flag: string): string {
  if (value === undefined || value.trim() === "") throw usage(`missing ${flag}`);
  return value;
}

function one(positionals: string[], what: string): string {
  if (positionals.length !== 1) throw usage(`expected one ${what}, got ${positionals.length}`);
  return positionals[0] ?? "";
}

function seconds(raw: string | undefined, flag: string): number | undefined {
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1) throw usage(`${flag} expects a whole number of seconds, got "${raw}"`);
  return n;
}

/** `null` means: print the task usage. */
export function parseTaskCommand(argv: string[]): { global: TaskGlobals; task: TaskAction } | null {
  const [action, ...rest] = argv;
  if (action === undefined || action === "--help" || action === "-h" || action === "help") return null;
  if (!Object.hasOwn(OPTIONS, action)) throw usage(`unknown task command "${action}"`);
  const name = action as TaskAction["action"];
  let parsed: { values: Record<string, string | boolean | string[] | undefined>; positionals: string[] };
  try {
    const options: ParseArgsConfig["options"] = OPTIONS[name];
    parsed = parseArgs({ args: rest, options, allowPositionals: true, strict: true }) as typeof parsed;
  } catch (err) {
    throw usage(err instanceof Error ? (err.message.split("\n")[0] ?? "invalid arguments") : "invalid arguments");
  }
  const v = parsed.values as Record<string, string | undefined> & { config?: string[]; json?: boolean; help?: boolean };
  if (v.help === true) return null;
  const global = { url: v.url, token: v.token, json: v.json === true };
  const p = parsed.positionals;
  switch (name) {
    case "create": {
      const instruction = one(p, 'INSTRUCTION (quote it: "Fix the failing test")');
      if (instruction.trim() === "") throw usage("the instruction is empty");
      if (v.key?.trim() === "") throw usage("--key must not be empty");
      return {
        global,
        task: {
          action: "create",
          project: required(v.project, "--project ID"),
          title: v.title,
          key: v.key,
          instruction,
        },
      };
    }
    case "attempt":
      return {
        global,
        task: {
          action: "attempt",
          taskId: one(p, "TASK_ID"),
          assignee: required(v.assignee, "--assignee NAME"),
          leaseSecs: seconds(v.lease, "--lease"),
          renew: v.renew,
          supersede: v.supersede,
        },
      };
    case "run":
      if (p.length > 0) throw usage(`task run takes no positional arguments (the task supplies the prompt)`);
      return {
        global,
        task: {
          action: "run",
          project: required(v.project, "--project ID"),
          provider: required(v.provider, "--provider ID"),
          ref: required(v.ref, "--ref ATTEMPT_REF"),
          timeoutSecs: seconds(v.timeout, "--timeout"),
          config: parseConfigPairs(v.config ?? []),
        },
      };
    case "reconcile":
      return { global, task: { action: "reconcile", taskId: one(p, "TASK_ID"), attemptId: v.attempt } };
    case "show":
      return { global, task: { action: "show", taskId: one(p, "TASK_ID") } };
    case "close": {
      const outcome = required(v.outcome, "--outcome succeeded|failed|abandoned");
      if (!OUTCOMES.includes(outcome)) throw usage(`--outcome must be one of ${OUTCOMES.join(", ")}`);
      return { global, task: { action: "close", taskId: one(p, "TASK_ID"), outcome } };
    }
    default: {
      const never: never = name;
      return never;
    }
  }
}
