/**
 * How `webcodex-runner` answers for help, the same way as `webcodex` and `webcodex-server`:
 *
 * - `webcodex-runner --help`, `-h` or `help`: the usage with a one-line description of each command, exit 0;
 * - `webcodex-runner CMD --help` (or `-h`, or `help CMD`): that command's usage, exit 0;
 * - an unknown command: one line naming it and a hint to `--help`, exit 2.
 */

import { answerHelpIn, type CommandHelp, commandUsageIn, type HelpAnswer, type HelpTable } from "@webcodex/protocol";

const BIN = "webcodex-runner";

export const COMMANDS: readonly CommandHelp[] = [
  {
    name: "run",
    summary: "Run the daemon: link to the Server and serve runs of the config's projects until SIGINT or SIGTERM.",
    usage: `${BIN} run --config FILE [--new-store]`,
  },
  {
    name: "check",
    summary: "Validate the config and say what it exposes; --probe starts one agent and reports what it offers.",
    usage: `${BIN} check --config FILE [--probe PROVIDER] [--project ID]`,
  },
  {
    name: "exec",
    summary: "Run one prompt locally, without a Server, and print its events (exits like `webcodex run`).",
    usage: `${BIN} exec --config FILE --project ID --provider ID [--json] [--config KEY=VALUE]... [--timeout SECS] [--log-level LEVEL] "prompt"`,
  },
  {
    name: "diagnose",
    summary: "Print a run's Runner-local diagnostics (stage, exit, stderr tail) by its run id.",
    usage: `${BIN} diagnose --config FILE RUN_ID`,
  },
  {
    name: "pool",
    summary: "List the run_as pool's users and whom each is bound to, or release one binding.",
    usage: `${BIN} pool --config FILE [release USER]`,
  },
  { name: "help", summary: "Show this help, or one command's usage (help CMD).", usage: `${BIN} help [CMD]` },
];

/** The usage of one command, printed after a usage mistake in it. */
export function commandUsage(name: string): string {
  return commandUsageIn(HELP, name);
}

export const USAGE = `${BIN} — the WebCodex Runner: starts coding agents (ACP) for a WebCodex Server

usage:
${COMMANDS.map((c) => `  ${c.usage}`).join("\n")}

commands:
${COMMANDS.map((c) => `  ${c.name.padEnd(9)} ${c.summary}`).join("\n")}

Exit codes: 0 success · 1 failure · 2 invalid config or usage · 3 store refused (run); exec as \`webcodex run\`.
Run \`${BIN} CMD --help\` for one command's usage.
`;

const HELP: HelpTable = { bin: BIN, commands: COMMANDS, usage: USAGE };

/** What to print for a help request or a command this binary does not have; null: neither (dispatch `argv`). */
export function answerHelp(argv: readonly string[]): HelpAnswer | null {
  return answerHelpIn(HELP, argv);
}
