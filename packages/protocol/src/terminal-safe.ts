/**
 * Terminal-safe text (design §4.5). Agent text is shown in terminals; a
 * control character in it can retitle the window (OSC 0/2), plant links
 * (OSC 8), clear the screen, move the cursor up and overwrite what the CLI
 * printed (a forged "completed" line), or reorder what a reader sees (bidi
 * overrides). `terminalSafe` removes all of that and keeps only newline and
 * tab:
 *
 * - whole escape sequences go first, so their parameters do not survive as
 *   text: CSI (`ESC [` / U+009B … final byte), string sequences (OSC, DCS,
 *   SOS, PM, APC: `ESC ] P X ^ _` or their C1 forms, up to BEL / ST), and
 *   two-byte ESC sequences. An unterminated string sequence loses only its
 *   introducer (the rest stays as harmless text);
 * - a carriage return becomes a newline (CR LF → one newline), so it cannot
 *   rewrite the line it is on;
 * - every other C0 control, DEL, every C1 control and the Unicode bidi
 *   controls (U+061C, U+200E/F, U+202A–E, U+2066–9) are removed.
 *
 * Linear time: every pattern stops at the next ESC or C1 character. Idempotent.
 */

// biome-ignore-all lint/suspicious/noControlCharactersInRegex: matching control characters is the point

/** Anything this module would change (fast path: most text has none). */
const UNSAFE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/;

/** CSI: ESC [ or U+009B, parameter bytes, intermediate bytes, one final byte. */
const CSI = /(?:\u001b\[|\u009b)[\u0030-\u003f]*[\u0020-\u002f]*[\u0040-\u007e]/g;
/** OSC / DCS / SOS / PM / APC with their terminator (BEL, ESC \ or U+009C). */
const STRING_SEQUENCE =
  /(?:\u001b[\]PX^_]|[\u0090\u0098\u009d\u009e\u009f])[^\u0007\u001b\u0080-\u009f]*(?:\u0007|\u001b\\|\u009c)/g;
/** Other escape sequences: ESC, intermediate bytes, one final byte. */
const ESCAPE = /\u001b[\u0020-\u002f]*[\u0030-\u007e]/g;
const CARRIAGE_RETURN = /\r\n?/g;
const CONTROLS = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

/** `text` without terminal control sequences, C0/C1 controls (but `\n`, `\t`) or bidi controls. */
export function terminalSafe(text: string): string {
  if (!UNSAFE.test(text)) return text;
  return text
    .replace(STRING_SEQUENCE, "")
    .replace(CSI, "")
    .replace(ESCAPE, "")
    .replace(CARRIAGE_RETURN, "\n")
    .replace(CONTROLS, "");
}

/** Whether `text` is already terminal-safe (what `terminalSafe` would return unchanged). */
export function isTerminalSafe(text: string): boolean {
  return !UNSAFE.test(text);
}
