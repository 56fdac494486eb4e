/**
 * Defence in depth for what the CLI prints that came from the Server (design
 * §4.5): the Runner already strips terminal controls from event text, but the
 * CLI does not rely on it. Every C0 control other than newline and tab, DEL,
 * every C1 control and the Unicode bidi controls become visible escapes
 * (`\x1b`, `\x9b`, `\u202e`), so agent text can neither drive the terminal
 * (titles, links, clearing, cursor moves that forge a "completed" line) nor
 * reorder what a reader sees — piped or on a TTY. The CLI's own colours are
 * added after this, by `paint`.
 */

// biome-ignore-all lint/suspicious/noControlCharactersInRegex: matching control characters is the point
const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

function visible(char: string): string {
  const code = char.charCodeAt(0);
  return code <= 0xff ? `\\x${code.toString(16).padStart(2, "0")}` : `\\u${code.toString(16).padStart(4, "0")}`;
}

/** `text` with every terminal control made visible (`ESC` → `\x1b`); newlines and tabs stay. */
export function escapeControls(text: string): string {
  return text.replace(CONTROL, visible);
}

/** A copy of `value` with every string in it passed through `escapeControls`. */
export function escapeDeep<T>(value: T): T {
  if (typeof value === "string") return escapeControls(value) as T;
  if (Array.isArray(value)) return value.map((v) => escapeDeep(v)) as T;
  if (value instanceof Map) return new Map([...value].map(([k, v]) => [escapeDeep(k), escapeDeep(v)])) as T;
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) out[k] = escapeDeep(v);
    return out as T;
  }
  return value;
}

/** JSON.stringify escapes C0 controls but leaves DEL, C1 and bidi controls raw: escape those as `\uXXXX` too. */
const JSON_RAW = /[\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]/g;

/** One JSON line (ndjson) that carries no raw terminal control; the data is unchanged for a JSON reader. */
export function safeJsonLine(value: unknown): string {
  return `${JSON.stringify(value).replace(JSON_RAW, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`)}\n`;
}
