/**
 * How `webcodex` answers for help, the same way as `webcodex-server` and `webcodex-runner`:
 *
 * - `webcodex --help`, `-h` or `help`: the usage with a one-line description of each command, exit 0;
 * - `webcodex CMD --help` (or `-h`, or `help CMD`): that command's usage, exit 0;
 * - an unknown command: one line naming it and a hint to `--help`, exit 2 (args.ts).
 */
import { SESSION_USAGE } from "./session-args.js";
import { TASK_USAGE } from "./task-args.js";

/** One command: its name, what it does in one line, and its usage lines. */
export interface CommandHelp {
  readonly name: string;
  readonly summary: string;
  readonly usage: string;
}

const CONNECTION = `  --url URL         Server MCP URL (default: $WEBCODEX_URL), e.g. http://127.0.0.1:7420/mcp
  --token TOKEN     Principal bearer token (default: $WEBCODEX_TOKEN; prefer the variable)
  --json            One JSON object per line (ndjson) instead of text`;

export const COMMANDS: readonly CommandHelp[] = [
  {
    name: "run",
    summary: "Start a run and follow it live until it ends (Ctrl-C asks the Server to cancel it).",
    usage: `webcodex run --project ID --provider ID [--key K] [--timeout SECS] [--config KEY=VALUE]...
             [--session SESSION_ID] [--context-session SESSION_ID [--context-version N]]
             [--continue RUN_ID|TASK_ID] "PROMPT"

  PROMPT "-" reads the prompt from stdin. Ctrl-C asks the Server to cancel the run and keeps following;
  a second Ctrl-C stops following at once.

  --key K           Idempotency key: the same key always means the same run, never a second
                    dispatch. Without it a random key is generated and printed.
  --timeout SECS    Run deadline in seconds (the Runner clamps it to its maximum)
  --config K=V      Agent config option (only ids the provider allows); true/false are booleans
  --session ID      Record the run's lifecycle in this workflow session (yours, same project)
  --context-session ID
                    Start from this workflow session's handoff and goal, quoted before the prompt
  --context-version N
                    The session version you reviewed (webcodex session show); if the session
                    changed since, nothing starts (context_version_conflict)
  --continue RUN_ID A follow-up turn: the agent resumes that ended run's session (same --project and
                    --provider) before this prompt. One follow-up per run (continuation_conflict);
                    an agent that cannot resume is refused (continuation_unsupported)
${CONNECTION}`,
  },
  {
    name: "observe",
    summary: "Show a run's state and events; --follow keeps watching until it ends.",
    usage: `webcodex observe RUN_ID|TASK_ID [--follow]

  -f, --follow      Follow until the run ends
${CONNECTION}`,
  },
  {
    name: "cancel",
    summary: "Ask the Server to cancel a run (idempotent).",
    usage: `webcodex cancel RUN_ID|TASK_ID\n\n${CONNECTION}`,
  },
  {
    name: "changes",
    summary: "A worktree run's recorded change: its branch, files and counts; --patch prints the diff too.",
    usage: `webcodex changes RUN_ID|TASK_ID [--patch]

  -p, --patch       Print the whole unified diff after the files (read page by page)
${CONNECTION}`,
  },
  {
    name: "apply",
    summary: "Bring an ended worktree run's change into a branch (fast-forward or clean merge, never forced).",
    usage: `webcodex apply RUN_ID|TASK_ID --to BRANCH [--key K]

  A branch checked out in the project's tree is updated with its files, only when that tree is clean.
  A conflict changes nothing, names the conflicting paths and exits 1. Needs project:write.

  --to BRANCH       The project's branch to bring the change into (it must exist)
  --key K           Idempotency key: the same key gets the same answer and never applies twice.
                    Without it a random key is generated and printed.
${CONNECTION}`,
  },
  {
    name: "status",
    summary: "Projects this token may use, whether their Runner is online, and its providers.",
    usage: `webcodex status\n\n${CONNECTION}`,
  },
  {
    name: "task",
    summary: "Managed tasks: the Server owns a task, its attempts (lease, fence) and each attempt's one run.",
    usage: TASK_USAGE.trimEnd(),
  },
  {
    name: "session",
    summary: "Workflow sessions: a ledger runs record into (--session) and start from (--context-session).",
    usage: SESSION_USAGE.trimEnd(),
  },
  { name: "help", summary: "Show this help, or one command's usage (help CMD).", usage: "webcodex help [CMD]" },
];

export const COMMAND_NAMES: readonly string[] = COMMANDS.map((c) => c.name);

/** One command's help: its description, then its usage. */
export function commandHelp(name: string): string {
  const cmd = COMMANDS.find((c) => c.name === name);
  if (cmd === undefined) return USAGE;
  return `${cmd.summary}\n\nUsage:\n  ${cmd.usage}\n`;
}

export const USAGE = `webcodex — start, follow and cancel coding-agent runs on a WebCodex Server (over MCP)

Usage:
  webcodex run --project ID --provider ID [--key K] [--timeout SECS] [--config KEY=VALUE]... "PROMPT"
  webcodex observe RUN_ID|TASK_ID [--follow]
  webcodex cancel RUN_ID|TASK_ID
  webcodex changes RUN_ID|TASK_ID [--patch]
  webcodex apply RUN_ID|TASK_ID --to BRANCH [--key K]
  webcodex status
  webcodex task create|attempt|run|reconcile|show|close …
  webcodex session create|update|show …
  webcodex help [CMD]

Commands:
${COMMANDS.map((c) => `  ${c.name.padEnd(9)} ${c.summary}`).join("\n")}

Options:
${CONNECTION}
  -h, --help        Show this help (after a command: that command's usage)
  -V, --version     Show the version

Exit codes: 0 completed · 1 failed or error · 2 usage error · 3 lost · 4 permission deadline · 5 run deadline · 130 cancelled/interrupted
Run \`webcodex CMD --help\` for one command's usage and options.
`;
