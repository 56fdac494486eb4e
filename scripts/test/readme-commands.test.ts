/**
 * Runs every `npx webcodex …` line of the README's ```sh blocks, in order,
 * against a fresh demo stack — so the documented commands are tested, not
 * eyeballed. RUN_ID is replaced by the id of the most recent run. A run of the
 * `slow` scenario is the one the README says to stop with Ctrl-C: the test
 * sends SIGINT once it ticks and expects the cancel and exit 130.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { REPO_ROOT as ROOT } from "../test-support/index.js";
import { type DemoStack, removeDir, runCli, startDemo, survivors } from "./demo-stack.js";

/** Splits a shell command line into words (double/single quotes, no expansions). */
function shellWords(line: string): string[] {
  const words: string[] = [];
  let current = "";
  let quote: '"' | "'" | undefined;
  let inWord = false;
  for (const ch of line) {
    if (quote !== undefined) {
      if (ch === quote) quote = undefined;
      else current += ch;
    } else if (ch === '"' || ch === "'") {
      quote = ch;
      inWord = true;
    } else if (ch === "#" && !inWord) {
      break;
    } else if (/\s/.test(ch)) {
      if (inWord) words.push(current);
      current = "";
      inWord = false;
    } else {
      current += ch;
      inWord = true;
    }
  }
  if (quote !== undefined) throw new Error(`unbalanced quote in: ${line}`);
  if (inWord) words.push(current);
  return words;
}

function readmeCommands(markdown: string): string[] {
  const commands: string[] = [];
  for (const block of markdown.matchAll(/```sh\n([\s\S]*?)```/g)) {
    for (const line of (block[1] ?? "").split("\n")) {
      if (line.trim().startsWith("npx webcodex ")) commands.push(line.trim());
    }
  }
  return commands;
}

describe("README commands", () => {
  const commands = readmeCommands(readFileSync(join(ROOT, "README.md"), "utf8"));
  let demo: DemoStack | undefined;

  afterAll(async () => {
    if (demo === undefined) return;
    const tracked = demo.descendants();
    await demo.stop();
    removeDir(demo.dir);
    expect(survivors(tracked)).toEqual([]);
  });

  it("documents every setting of the demo", () => {
    const readme = readFileSync(join(ROOT, "README.md"), "utf8");
    const demo = readFileSync(join(ROOT, "scripts", "demo.mjs"), "utf8");
    const settings = new Set([...demo.matchAll(/process\.env\.(WEBCODEX_DEMO_\w+)/g)].map((m) => m[1]));
    expect(settings).toContain("WEBCODEX_DEMO_PORT");
    for (const name of settings) expect(readme, name).toContain(`\`${name}`);
  });

  it("documents the tour's commands", () => {
    expect(commands.length).toBeGreaterThanOrEqual(6);
    expect(commands.some((c) => c.startsWith("npx webcodex run "))).toBe(true);
    expect(commands.some((c) => c.includes("RUN_ID"))).toBe(true);
    expect(shellWords('npx webcodex run --project demo "scenario: tools"  # note')).toEqual([
      "npx",
      "webcodex",
      "run",
      "--project",
      "demo",
      "scenario: tools",
    ]);
  });

  it("runs each documented webcodex command against the demo stack", async () => {
    demo = await startDemo();
    const stack = demo;
    // What `npm start` suggests to try is what the README documents, word for word.
    const suggested = stack
      .output()
      .split("\n")
      .map((line) => line.trim())
      .filter((line) => line.startsWith("npx webcodex "));
    expect(suggested.length).toBeGreaterThanOrEqual(3);
    for (const line of suggested) expect(commands, line).toContain(line);
    let lastRunId: string | undefined;
    const previous: string[] = [];
    for (const command of commands) {
      const words = shellWords(command).slice(2);
      const args = words.map((w) => {
        if (w !== "RUN_ID") return w;
        expect(lastRunId, `${command} needs an earlier run`).toBeDefined();
        return lastRunId!;
      });
      const slow = args[0] === "run" && args.some((a) => a.startsWith("scenario: slow"));
      let interrupted = false;
      const result = await runCli(args, stack, {
        onStdout: (text, child) => {
          if (slow && !interrupted && text.includes("tick")) {
            interrupted = true;
            child.kill("SIGINT");
          }
        },
      });
      const context = `${command}\n--- stdout\n${result.stdout}\n--- stderr\n${result.stderr}`;
      if (slow) {
        expect(result.code, context).toBe(130);
        expect(result.stdout, context).toContain("cancel requested");
        expect(result.stdout, context).toContain("⊘ cancelled");
      } else {
        expect(result.code, context).toBe(0);
      }
      if (previous.includes(command) && args.includes("--key")) {
        expect(result.stdout, context).toContain("reattached to");
      }
      previous.push(command);
      lastRunId = /wc_agent_run_[a-z0-9]+/.exec(result.stdout)?.[0] ?? lastRunId;
    }
  }, 240_000);
});
