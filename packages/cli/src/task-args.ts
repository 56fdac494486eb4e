/**
 * Parsing of `webcodex task …` (the managed path, design §10). Kept apart
 * from args.ts: one subcommand per Server tool, each with its own flags.
 */
import type { ParseArgsConfig } from "node:util";
import { parseConfigPairs } from "./config-pairs.js";
import { SUBCOMMAND_GLOBAL, type SubcommandGlobals, subcommandFamily } from "./subcommand-args.js";
import type { ConfigValue } from "./wire.js";

export const TASK_USAGE = `Managed tasks (the Server keeps ownership across host restarts):
  webcodex task create --project ID [--title T] [--key K] "INSTRUCTION"   (INSTRUCTION "-" reads stdin)
  webcodex task attempt TASK_ID --assignee NAME [--lease SECS] [--renew ATTEMPT_REF] [--supersede RUN_ID]
  webcodex task run --project ID --provider ID --ref ATTEMPT_REF [--timeout SECS] [--config K=V]... [--continue RUN_ID]
  webcodex task reconcile TASK_ID [--attempt ATTEMPT_ID]
  webcodex task show TASK_ID
  webcodex task close TASK_ID --outcome succeeded|failed|abandoned
`;

/** The global flags of a task subcommand. */
export type TaskGlobals = SubcommandGlobals;

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
      /** continue_run_id: the ended run whose agent session this task's run continues (design §17). */
      continueRun: string | undefined;
    }
  | { action: "reconcile"; taskId: string; attemptId: string | undefined }
  | { action: "show"; taskId: string }
  | { action: "close"; taskId: string; outcome: string };

const OPTIONS = {
  create: { ...SUBCOMMAND_GLOBAL, project: { type: "string" }, title: { type: "string" }, key: { type: "string" } },
  attempt: {
    ...SUBCOMMAND_GLOBAL,
    assignee: { type: "string" },
    lease: { type: "string" },
    renew: { type: "string" },
    supersede: { type: "string" },
  },
  run: {
    ...SUBCOMMAND_GLOBAL,
    project: { type: "string" },
    provider: { type: "string" },
    ref: { type: "string" },
    timeout: { type: "string" },
    config: { type: "string", multiple: true },
    continue: { type: "string" },
  },
  reconcile: { ...SUBCOMMAND_GLOBAL, attempt: { type: "string" } },
  show: SUBCOMMAND_GLOBAL,
  close: { ...SUBCOMMAND_GLOBAL, outcome: { type: "string" } },
} as const satisfies Record<TaskAction["action"], ParseArgsConfig["options"]>;

const OUTCOMES = ["succeeded", "failed", "abandoned"];

const args = subcommandFamily("task");
const { usage, one, required } = args;
const seconds = (raw: string | undefined, flag: string) => args.wholeNumber(raw, flag, 1, "a whole number of seconds");
/** What `--continue` takes on `task run`: a run id (`webcodex run --continue` also takes a task id). */
const RUN_ID = /^wc_agent_run_[a-z2-7]{26}$/;
function runId(raw: string | undefined): string | undefined {
  if (raw !== undefined && !RUN_ID.test(raw)) {
    throw usage(`--continue expects the RUN_ID (wc_agent_run_…) of one of your ended runs, got "${raw}"`);
  }
  return raw;
}

/** `null` means: print the task usage. */
export function parseTaskCommand(argv: string[]): { global: TaskGlobals; task: TaskAction } | null {
  const cmd = args.parse(argv, OPTIONS);
  if (cmd === null) return null;
  const { name, values: v, positionals: p, global } = cmd;
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
          continueRun: runId(v.continue),
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
