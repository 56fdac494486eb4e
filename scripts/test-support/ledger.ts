/**
 * The fake agent's ledger (`--ledger FILE`): one JSON object per line, each
 * appended whole and newline-terminated by the agent, with at least `event`
 * ("prompt" for every session/prompt that reached it, "grandchild",
 * "permission_outcome", …).
 */
import { readFileSync } from "node:fs";

export type LedgerLine = { event: string } & Record<string, unknown>;

/**
 * Every complete line of the ledger, in order; [] while the file does not
 * exist. A last line without its newline is still being written and is left
 * out, so a reader polling the file never parses half a line.
 */
export function readLedger(file: string): LedgerLine[] {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch {
    return [];
  }
  const lines = text.split("\n");
  lines.pop(); // "" after the last newline, or the unfinished line
  return lines.filter((line) => line.trim() !== "").map((line) => JSON.parse(line) as LedgerLine);
}

/** The ledger's `prompt` lines: one per session/prompt the agent received. */
export function ledgerPrompts(file: string): LedgerLine[] {
  return readLedger(file).filter((line) => line.event === "prompt");
}
