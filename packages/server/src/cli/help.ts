/**
 * How `webcodex-server` answers for help, the same way as `webcodex` and `webcodex-runner`:
 *
 * - `webcodex-server --help`, `-h` or `help`: the usage with a one-line description of each command, exit 0;
 * - `webcodex-server CMD --help` (or `-h`, or `help CMD`): that command's usage, exit 0;
 * - an unknown command: one line naming it and a hint to `--help`, exit 2.
 *
 * The commands' usage lines live here, in one table, so the subcommand modules and the help print the same.
 */

import { answerHelpIn, type CommandHelp, commandUsageIn, type HelpAnswer, type HelpTable } from "@webcodex/protocol";

/** Rows `oauth audit list` prints by default, and at most. */
export const AUDIT_LIST_DEFAULT = 100;
export const AUDIT_LIST_MAX = 10_000;

const BIN = "webcodex-server";

export const COMMANDS: readonly CommandHelp[] = [
  {
    name: "run",
    summary: "Serve MCP clients and Runners with the config FILE until SIGINT or SIGTERM.",
    usage: `${BIN} run --config FILE`,
  },
  {
    name: "token",
    summary: "Issue, list or revoke principal bearer tokens (printed once; only their hash is stored).",
    usage: `${BIN} token issue --config FILE --principal ID --scope SCOPE... [--project ID...] [--allow-coding-agent-run] [--json]
  ${BIN} token list --config FILE [--principal ID]
  ${BIN} token revoke --config FILE --id TOKEN_ID`,
  },
  {
    name: "runner-token",
    summary: "Make a Runner's token and the [[runners]] block that admits it, or rotate it.",
    usage: `${BIN} runner-token issue --runner ID [--config FILE]
  ${BIN} runner-token rotate --runner ID --config FILE`,
  },
  {
    name: "oauth",
    summary: "List, provision and revoke OAuth clients and grants; read the OAuth audit.",
    usage: `${BIN} oauth clients list --config FILE [--json]
  ${BIN} oauth clients show CLIENT_ID --config FILE
  ${BIN} oauth clients revoke CLIENT_ID --config FILE
  ${BIN} oauth clients allow-coding-agent-run CLIENT_ID --config FILE
  ${BIN} oauth clients disallow-coding-agent-run CLIENT_ID --config FILE
  ${BIN} oauth clients allow-operator-read CLIENT_ID --config FILE
  ${BIN} oauth clients disallow-operator-read CLIENT_ID --config FILE
  ${BIN} oauth grants list --config FILE [--principal ID] [--client CLIENT_ID] [--json]
  ${BIN} oauth grants revoke --config FILE (--id GRANT_ID | --principal ID | --client CLIENT_ID)
  ${BIN} oauth audit list --config FILE [--limit N] [--json]   (N: 1 … ${AUDIT_LIST_MAX}, default ${AUDIT_LIST_DEFAULT})`,
  },
  {
    name: "webhooks",
    summary:
      "Subscribe a principal's runs and tasks to signed webhooks; list, remove, rotate a secret, re-enable, audit, ping, redeliver a dead letter.",
    usage: `${BIN} webhooks add --config FILE --principal ID --url URL --events TYPE[,TYPE...] [--json]
  ${BIN} webhooks list --config FILE [--principal ID] [--json]
  ${BIN} webhooks remove --config FILE --id SUBSCRIPTION_ID
  ${BIN} webhooks rotate-secret --config FILE --id SUBSCRIPTION_ID [--overlap-secs N] [--json]
  ${BIN} webhooks enable --config FILE --id SUBSCRIPTION_ID
  ${BIN} webhooks audit --config FILE [--id SUBSCRIPTION_ID] [--json]
  ${BIN} webhooks test --config FILE --id SUBSCRIPTION_ID
  ${BIN} webhooks redeliver --config FILE --event EVENT_ID
  (TYPE: run.started, run.waiting_permission, run.terminal, run.lost, task.attempt_expired, task.closed)`,
  },
  {
    name: "mcp-stdio",
    summary: "Bridge an MCP client that speaks stdio to the Server's HTTP endpoint (token from the named variable).",
    usage: `${BIN} mcp-stdio --url http://127.0.0.1:PORT/mcp --token-env VAR`,
  },
  { name: "help", summary: "Show this help, or one command's usage (help CMD).", usage: `${BIN} help [CMD]` },
];

/** The usage of one command, as its module prints it after a usage mistake. */
export function commandUsage(name: string): string {
  return commandUsageIn(HELP, name);
}

export const USAGE = `${BIN} — the WebCodex Server: MCP for clients, a WebSocket link for Runners

usage:
${COMMANDS.map((c) => `  ${c.usage}`).join("\n")}

commands:
${COMMANDS.map((c) => `  ${c.name.padEnd(13)} ${c.summary}`).join("\n")}

Run \`${BIN} CMD --help\` for one command's usage.
`;

const HELP: HelpTable = { bin: BIN, commands: COMMANDS, usage: USAGE };

/** What to print for a help request or a command this binary does not have; null: neither (dispatch `argv`). */
export function answerHelp(argv: readonly string[]): HelpAnswer | null {
  return answerHelpIn(HELP, argv);
}
