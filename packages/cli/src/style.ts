/**
 * Colour and symbols for human output. Colour is used only when the output
 * stream is a TTY and NO_COLOR is unset (https://no-color.org); everything
 * else renders the same text without escape codes.
 */

export interface Style {
  /** "text" for people, "json" for one JSON object per line (ndjson). */
  readonly mode: "text" | "json";
  readonly color: boolean;
}

export const PLAIN: Style = { mode: "text", color: false };
export const JSON_STYLE: Style = { mode: "json", color: false };

export function wantsColor(stream: { isTTY?: boolean }, env: NodeJS.ProcessEnv): boolean {
  if (stream.isTTY !== true) return false;
  if (env.NO_COLOR !== undefined && env.NO_COLOR !== "") return false;
  return env.TERM !== "dumb";
}

const CODES = {
  bold: [1, 22],
  dim: [2, 22],
  red: [31, 39],
  green: [32, 39],
  yellow: [33, 39],
  blue: [34, 39],
  magenta: [35, 39],
  cyan: [36, 39],
  gray: [90, 39],
} as const;
export type Tone = keyof typeof CODES;

export function paint(style: Style, tone: Tone, text: string): string {
  if (!style.color || text === "") return text;
  const [open, close] = CODES[tone];
  return `\u001b[${open}m${text}\u001b[${close}m`;
}

/** Removes ANSI escape sequences (used by tests and for width checks). */
export function stripAnsi(text: string): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: matching ANSI escapes is the point
  return text.replace(/\u001b\[[0-9;]*[A-Za-z]/g, "");
}

export function styleFor(json: boolean, stream: { isTTY?: boolean }, env: NodeJS.ProcessEnv): Style {
  return json ? JSON_STYLE : { mode: "text", color: wantsColor(stream, env) };
}
