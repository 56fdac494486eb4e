/**
 * Command-line parsing (node:util parseArgs). Every mistake becomes a
 * CliError("usage") that names the problem; main prints it with the usage
 * text and exits 2.
 */
import { type ParseArgsConfig, parseArgs } from "node:util";
import { parseConfigPairs } from "./config-pairs.js";
import { CliError } from "./errors.js";
import { COMMAND_NAMES, USAGE } from "./help.js";
import { parseSessionCommand, SESSION_USAGE, type SessionAction } from "./session-args.js";
import { parseTaskCommand, TASK_USAGE, type TaskAction } from "./task-args.js";
import type { ConfigValue } from "./wire.js";

export { SESSION_USAGE, TASK_USAGE, USAGE };

export interface GlobalOptions {
  url: string | undefined;
  token: string | undefined;
  json: boolean;
}

export type Command =
  /** The usage of every command, or of `topic` alone (help.ts). */
  | { name: "help"; topic?: string }
  | { name: "version" }
  | {
      name: "run";
      global: GlobalOptions;
      project: string;
      provider: string;
      key: string | undefined;
      timeoutSecs: number | undefined;
      config: Record<string, ConfigValue>;
      /** workflow_session_id: the session that records this run. */
      session: string | undefined;
      /** context_session_id: the session whose handoff and goal are quoted before the prompt. */
      contextSession: string | undefined;
      /** context_session_version: the session version the caller reviewed (needs contextSession). */
      contextVersion: number | undefined;
      /** continue_run_id: the terminal run (or its task id) whose conversation this run continues. */
      continueRun: string | undefined;
      /** "-" means read stdin. */
      prompt: string;
    }
  | { name: "observe"; global: GlobalOptions; runId: string; follow: boolean }
  | { name: "cancel"; global: GlobalOptions; runId: string }
  | { name: "changes"; global: GlobalOptions; runId: string; patch: boolean }
  | { name: "apply"; global: GlobalOptions; runId: string; to: string; key: string | undefined }
  | { name: "status"; global: GlobalOptions }
  | { name: "task"; global: GlobalOptions; task: TaskAction }
  | { name: "task-help" }
  | { name: "session"; global: GlobalOptions; session: SessionAction }
  | { name: "session-help" };

const GLOBAL_OPTIONS = {
  url: { type: "string" },
  token: { type: "string" },
  json: { type: "boolean" },
  help: { type: "boolean", short: "h" },
  version: { type: "boolean", short: "V" },
} as const satisfies ParseArgsConfig["options"];

const RUN_OPTIONS = {
  ...GLOBAL_OPTIONS,
  project: { type: "string" },
  provider: { type: "string" },
  key: { type: "string" },
  timeout: { type: "string" },
  config: { type: "string", multiple: true },
  session: { type: "string" },
  "context-session": { type: "string" },
  "context-version": { type: "string" },
  continue: { type: "string" },
} as const satisfies ParseArgsConfig["options"];

const OBSERVE_OPTIONS = {
  ...GLOBAL_OPTIONS,
  follow: { type: "boolean", short: "f" },
} as const satisfies ParseArgsConfig["options"];

const CHANGES_OPTIONS = {
  ...GLOBAL_OPTIONS,
  patch: { type: "boolean", short: "p" },
} as const satisfies ParseArgsConfig["options"];

const APPLY_OPTIONS = {
  ...GLOBAL_OPTIONS,
  to: { type: "string" },
  key: { type: "string" },
} as const satisfies ParseArgsConfig["options"];

/** What `--continue` takes: a run id, or the task id of a task-backed start (resolved to its run). */
const RUN_OR_TASK_ID = /^(wc_agent_run_[a-z2-7]{26}|wc_task_[a-z2-7]{26}_[A-Za-z0-9_-]{22})$/;

function usage(message: string): CliError {
  return new CliError("usage", message, { hint: "Run `webcodex --help` for usage." });
}

function parse<O extends NonNullable<ParseArgsConfig["options"]>>(args: string[], options: O) {
  try {
    return parseArgs({ args, options, allowPositionals: true, strict: true });
  } catch (err) {
    // parseArgs messages name the option ("Unknown option '--foo'"); keep them.
    throw usage(err instanceof Error ? (err.message.split("\n")[0] ?? "invalid arguments") : "invalid arguments");
  }
}

function globals(values: {
  url?: string | undefined;
  token?: string | undefined;
  json?: boolean | undefined;
}): GlobalOptions {
  return { url: values.url, token: values.token, json: values.json === true };
}

function required(value: string | undefined, flag: string): string {
  if (value === undefined || value.trim() === "") throw usage(`missing ${flag}`);
  return value;
}

function single(positionals: string[], what: string): string {
  if (positionals.length === 0) throw usage(`missing ${what}`);
  if (positionals.length > 1) throw usage(`expected one ${what}, got ${positionals.length}: ${positionals.join(" ")}`);
  return positionals[0] ?? "";
}

export function parseCommand(argv: readonly string[]): Command {
  const [first, ...rest] = argv;
  if (first === undefined) throw usage("missing command");
  if (first.startsWith("-")) {
    const { values, positionals } = parse([...argv], GLOBAL_OPTIONS);
    if (values.version === true) return { name: "version" };
    if (values.help === true && positionals.length === 0) return { name: "help" };
    throw usage('put the command first, e.g. `webcodex run --project demo --provider fake "Say hello."`');
  }
  if (!COMMAND_NAMES.includes(first)) throw usage(`unknown command "${first}"`);
  switch (first) {
    case "help": {
      const topic = rest.find((a) => !a.startsWith("-"));
      if (topic !== undefined && !COMMAND_NAMES.includes(topic)) throw usage(`unknown command "${topic}"`);
      return topic === undefined ? { name: "help" } : { name: "help", topic };
    }
    case "run": {
      const { values, positionals } = parse(rest, RUN_OPTIONS);
      if (values.help === true) return { name: "help", topic: "run" };
      let timeoutSecs: number | undefined;
      if (values.timeout !== undefined) {
        timeoutSecs = Number(values.timeout);
        if (!Number.isInteger(timeoutSecs) || timeoutSecs < 1) {
          throw usage(`--timeout expects a whole number of seconds, got "${values.timeout}"`);
        }
      }
      if (values.key?.trim() === "") throw usage("--key must not be empty");
      let contextVersion: number | undefined;
      if (values["context-version"] !== undefined) {
        contextVersion = Number(values["context-version"]);
        if (!/^[1-9][0-9]*$/.test(values["context-version"]) || !Number.isSafeInteger(contextVersion)) {
          throw usage(
            `--context-version expects a session version (a whole number ≥ 1), got "${values["context-version"]}"`,
          );
        }
        if (values["context-session"] === undefined) {
          throw usage("--context-version pins the version of --context-session; give --context-session too");
        }
      }
      if (values.continue !== undefined && !RUN_OR_TASK_ID.test(values.continue)) {
        throw usage(
          `--continue expects the RUN_ID (wc_agent_run_…) or TASK_ID (wc_task_…) of one of your ended runs, got "${values.continue}"`,
        );
      }
      const project = required(values.project, "--project ID");
      const provider = required(values.provider, "--provider ID");
      const prompt = single(positionals, 'PROMPT (quote it: "Fix the failing test")');
      if (prompt.trim() === "") throw usage("the prompt is empty");
      return {
        name: "run",
        global: globals(values),
        project,
        provider,
        key: values.key,
        timeoutSecs,
        config: parseConfigPairs(values.config ?? []),
        session: values.session,
        contextSession: values["context-session"],
        contextVersion,
        continueRun: values.continue,
        prompt,
      };
    }
    case "observe": {
      const { values, positionals } = parse(rest, OBSERVE_OPTIONS);
      if (values.help === true) return { name: "help", topic: "observe" };
      return {
        name: "observe",
        global: globals(values),
        runId: single(positionals, "RUN_ID"),
        follow: values.follow === true,
      };
    }
    case "cancel": {
      const { values, positionals } = parse(rest, GLOBAL_OPTIONS);
      if (values.help === true) return { name: "help", topic: "cancel" };
      return { name: "cancel", global: globals(values), runId: single(positionals, "RUN_ID") };
    }
    case "changes": {
      const { values, positionals } = parse(rest, CHANGES_OPTIONS);
      if (values.help === true) return { name: "help", topic: "changes" };
      return {
        name: "changes",
        global: globals(values),
        runId: single(positionals, "RUN_ID"),
        patch: values.patch === true,
      };
    }
    case "apply": {
      const { values, positionals } = parse(rest, APPLY_OPTIONS);
      if (values.help === true) return { name: "help", topic: "apply" };
      const runId = single(positionals, "RUN_ID");
      const to = required(values.to, "--to BRANCH");
      if (values.key?.trim() === "") throw usage("--key must not be empty");
      return { name: "apply", global: globals(values), runId, to, key: values.key };
    }
    case "task": {
      const parsed = parseTaskCommand(rest);
      return parsed === null ? { name: "task-help" } : { name: "task", global: parsed.global, task: parsed.task };
    }
    case "session": {
      const parsed = parseSessionCommand(rest);
      return parsed === null
        ? { name: "session-help" }
        : { name: "session", global: parsed.global, session: parsed.session };
    }
    case "status": {
      const { values, positionals } = parse(rest, GLOBAL_OPTIONS);
      if (values.help === true) return { name: "help", topic: "status" };
      if (positionals.length > 0) throw usage(`status takes no arguments, got: ${positionals.join(" ")}`);
      return { name: "status", global: globals(values) };
    }
    default:
      throw usage(`unknown command "${first}"`);
  }
}

/** --url/--token win over WEBCODEX_URL/WEBCODEX_TOKEN; both must end up set. */
export function resolveConnection(global: GlobalOptions, env: NodeJS.ProcessEnv): { url: string; token: string } {
  const url = global.url ?? env.WEBCODEX_URL;
  const token = global.token ?? env.WEBCODEX_TOKEN;
  if (url === undefined || url.trim() === "") {
    throw new CliError("usage", "no Server URL", {
      hint: "Pass --url http://HOST:PORT/mcp or set WEBCODEX_URL (`npm start` prints both).",
    });
  }
  if (token === undefined || token.trim() === "") {
    throw new CliError("usage", "no token", {
      hint: "Set WEBCODEX_TOKEN (or pass --token) to a principal token from `webcodex-server token issue`.",
    });
  }
  return { url: url.trim(), token: token.trim() };
}
