/**
 * How every WebCodex binary answers for help (`webcodex`, `webcodex-server`, `webcodex-runner`), from its own
 * command table — pure text, no I/O:
 *
 * - `BIN --help`, `-h` or `help`: the usage with a one-line description of each command, exit 0;
 * - `BIN CMD --help` (or `-h`, or `help CMD`): that command's usage, exit 0;
 * - an unknown command: one line naming it and a hint to `--help`, exit 2.
 */

/** One command: its name, what it does in one line, and its usage lines. */
export interface CommandHelp {
  readonly name: string;
  readonly summary: string;
  readonly usage: string;
}

/** A binary's help: its name, its commands, and the full usage text `BIN --help` prints. */
export interface HelpTable {
  readonly bin: string;
  readonly commands: readonly CommandHelp[];
  readonly usage: string;
}

export type HelpAnswer =
  | { kind: "usage"; text: string }
  | { kind: "unknown"; text: string }
  | { kind: "missing"; text: string };

const HELP_FLAGS = new Set(["--help", "-h"]);

/** The usage lines of one command, printed after a usage mistake in it. */
export function commandUsageIn(table: HelpTable, name: string): string {
  const cmd = table.commands.find((c) => c.name === name);
  return `usage:\n  ${cmd?.usage ?? ""}`;
}

/**
 * What to print for a help request or a command the binary does not have; null: neither (dispatch `argv`).
 * Only the arguments before `--` are looked at (after it, `-h` is a prompt).
 */
export function answerHelpIn(table: HelpTable, argv: readonly string[]): HelpAnswer | null {
  const end = argv.indexOf("--");
  const args = end === -1 ? argv : argv.slice(0, end);
  const [first, ...rest] = args;
  const known = (name: string) => table.commands.some((c) => c.name === name);
  if (first === undefined) return { kind: "missing", text: `${table.bin}: missing command\n\n${table.usage}` };
  if (HELP_FLAGS.has(first)) return { kind: "usage", text: table.usage };
  if (first === "help") {
    const topic = rest[0];
    if (topic === undefined) return { kind: "usage", text: table.usage };
    return known(topic) ? { kind: "usage", text: `${commandUsageIn(table, topic)}\n` } : unknown(table, topic);
  }
  if (!known(first)) return unknown(table, first);
  if (rest.some((a) => HELP_FLAGS.has(a))) {
    const cmd = table.commands.find((c) => c.name === first);
    return { kind: "usage", text: `${cmd?.summary ?? ""}\n\n${commandUsageIn(table, first)}\n` };
  }
  return null;
}

function unknown(table: HelpTable, name: string): HelpAnswer {
  return {
    kind: "unknown",
    text: `${table.bin}: unknown command ${JSON.stringify(name)}\nRun \`${table.bin} --help\` for the commands.\n`,
  };
}
