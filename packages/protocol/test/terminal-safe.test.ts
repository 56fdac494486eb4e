import { describe, expect, it } from "vitest";
import { isTerminalSafe, terminalSafe } from "../src/index.js";

const ESC = "\u001b";
const BEL = "\u0007";

/** Any character a terminal would act on, other than newline and tab. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
const RAW_CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/;

describe("terminalSafe (design §4.5)", () => {
  it.each([
    ["OSC window title (BEL)", `${ESC}]0;pwned title${BEL}hello`, "hello"],
    ["OSC window title (ST)", `${ESC}]2;pwned${ESC}\\hello`, "hello"],
    ["OSC 8 hyperlink", `${ESC}]8;;https://evil.example/${ESC}\\click${ESC}]8;;${ESC}\\ here`, "click here"],
    ["clear screen + home", `${ESC}[2J${ESC}[Hafter`, "after"],
    ["cursor up + erase line (forged line)", `x${ESC}[1A${ESC}[2K✔ completed`, "x✔ completed"],
    ["SGR colour", `${ESC}[31;1mred${ESC}[0m`, "red"],
    ["C1 CSI", "a\u009b2Jb", "ab"],
    ["C1 OSC with C1 ST", "a\u009d0;title\u009cb", "ab"],
    ["DCS", `a${ESC}Pq#0;2;0;0;0${ESC}\\b`, "ab"],
    ["two-byte ESC (RIS)", `a${ESC}cb`, "ab"],
    ["bidi override", "file\u202Etxt.exe\u202C done", "filetxt.exe done"],
    ["bidi isolates and marks", "\u2066a\u2067b\u2068c\u2069\u200e\u200f\u061c", "abc"],
    ["backspace, bell, NUL, DEL", "a\bb\u0007c\u0000d\u007fe", "abcde"],
    ["carriage return rewrites nothing", "10%\r20%\r\ndone", "10%\n20%\ndone"],
    ["unterminated OSC keeps its text", `${ESC}]0;no terminator`, "0;no terminator"],
    ["lone ESC at the end", `tail${ESC}`, "tail"],
    ["nested escape after removal", `${ESC}${ESC}[31m[2J`, "2J"],
  ])("%s", (_name, input, expected) => {
    const out = terminalSafe(input);
    expect(out).toBe(expected);
    expect(out).not.toMatch(RAW_CONTROL);
    expect(isTerminalSafe(out)).toBe(true);
    expect(terminalSafe(out)).toBe(out);
  });

  it("keeps newlines, tabs and ordinary Unicode unchanged (same string)", () => {
    const text = "line 1\n\tindented — ünïcödé ✓ 日本語 😀";
    expect(terminalSafe(text)).toBe(text);
    expect(isTerminalSafe(text)).toBe(true);
  });

  it("stays linear on adversarial input (many unterminated introducers)", () => {
    const text = `${ESC}]`.repeat(200_000) + "x".repeat(200_000) + `${ESC}[`.repeat(200_000);
    const out = terminalSafe(text);
    expect(out).not.toMatch(RAW_CONTROL);
    expect(out.endsWith("x".repeat(200_000))).toBe(true);
  });
});
