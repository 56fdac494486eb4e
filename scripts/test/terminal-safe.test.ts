/**
 * Terminal-safe text on the real stack (issue 19 §3): the demo (Server,
 * Runner, fake agent) plays the `escapes` scenario — OSC window titles, an
 * OSC 8 link, clear screen, cursor-up + erase with a forged "completed" line,
 * C1 controls and bidi overrides in messages, reasoning, plan, tool titles,
 * paths and ids — and the real `webcodex run` output (piped, text and
 * --json) holds no raw control character, while the text around the attacks
 * still arrives.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type DemoStack, removeDir, runCli, startDemo } from "./demo-stack.js";

// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
const RAW_CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/;

describe("terminal attacks from an agent through the whole stack", { timeout: 120_000 }, () => {
  let demo: DemoStack;
  beforeAll(async () => {
    demo = await startDemo();
  });
  afterAll(async () => {
    await demo?.stop();
    if (demo) removeDir(demo.dir);
  });

  it("webcodex run prints the escapes scenario without a raw control character", async () => {
    const run = await runCli(["run", "--project", "demo", "--provider", "fake", "scenario: escapes"], demo);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).not.toMatch(RAW_CONTROL);
    expect(run.stderr).not.toMatch(RAW_CONTROL);
    for (const marker of ["[osc_title]", "[osc8_link]click here", "[forged_completed]", "[bidi]", "end of escapes"]) {
      expect(run.stdout).toContain(marker);
    }
    expect(run.stdout).not.toContain("pwned-window-title");
    // The only "completed" summary line is the CLI's own, at the end.
    expect(run.stdout).toMatch(/✔ completed · stop reason end_turn · \d+(\.\d+)?s · wc_agent_run_/);
  });

  it("webcodex run --json prints the same run as ndjson without a raw control character", async () => {
    const run = await runCli(["run", "--json", "--project", "demo", "--provider", "fake", "scenario: escapes"], demo);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).not.toMatch(RAW_CONTROL);
    const lines = run.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { type: string; kind?: string; text?: string });
    const text = lines
      .filter((l) => l.type === "event" && l.kind === "agent_message")
      .map((l) => l.text)
      .join("");
    expect(text).not.toMatch(RAW_CONTROL);
    expect(text).toContain("[clear_screen]");
    expect(lines.at(-1)).toMatchObject({ type: "summary", state: "completed" });
  });
});
