/**
 * Runs every `npx webcodex …` line of the README's ```sh blocks, in order,
 * against a fresh demo stack — so the documented commands are tested, not
 * eyeballed. RUN_ID is replaced by the id of the most recent run. A run of the
 * `slow` scenario is the one the README says to stop with Ctrl-C: the test
 * sends SIGINT once it ticks and expects the cancel and exit 130.
 *
 * The workspaces tour (its own section) is run after, line by line, the way a
 * reader would: that demo restarted with the switch the README names, a line
 * ending in `&` started in the background, `wait` for them, and `git -C
 * .webcodex/demo/project …` in the demo's state folder.
 */
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
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

/** The README's section on workspace mode: its sh lines are the workspaces tour. */
const WORKSPACES_HEADING = "## Workspaces: a checkout of its own per run";
/** How the tour switches the demo project to worktree mode. */
const WORKSPACE_SWITCH = { WEBCODEX_DEMO_WORKSPACE: "worktree" };
/** Bound on the demo becoming ready (a restart included) on a loaded machine. */
const DEMO_READY_MS = 180_000;

/** `markdown` split at its `## ` headings: the workspaces section, and all the rest. */
function splitWorkspaces(markdown: string): { rest: string; workspaces: string } {
  const at = markdown.indexOf(`${WORKSPACES_HEADING}\n`);
  if (at < 0) throw new Error(`the README has no section "${WORKSPACES_HEADING}"`);
  const end = markdown.indexOf("\n## ", at + WORKSPACES_HEADING.length);
  const stop = end < 0 ? markdown.length : end + 1;
  return { rest: markdown.slice(0, at) + markdown.slice(stop), workspaces: markdown.slice(at, stop) };
}

/** Every non-empty line of the ```sh blocks of `markdown`, trimmed. */
function shLines(markdown: string): string[] {
  const lines: string[] = [];
  for (const block of markdown.matchAll(/```sh\n([\s\S]*?)```/g)) {
    for (const line of (block[1] ?? "").split("\n")) if (line.trim() !== "") lines.push(line.trim());
  }
  return lines;
}

function readmeCommands(markdown: string): string[] {
  return shLines(markdown).filter((line) => line.startsWith("npx webcodex "));
}

describe("README commands", () => {
  const readme = splitWorkspaces(readFileSync(join(ROOT, "README.md"), "utf8"));
  const commands = readmeCommands(readme.rest);
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
    demo = await startDemo({ timeoutMs: DEMO_READY_MS });
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
  it("runs the workspaces tour: the demo switched to worktree, two runs at once, changes and apply", async () => {
    const lines = shLines(readme.workspaces);
    const [start, ...tour] = lines;
    expect(start, "the tour's first line switches the demo").toBe(
      `${Object.entries(WORKSPACE_SWITCH).map(([k, v]) => `${k}=${v}`)} npm start`,
    );
    // As the reader does: the demo of the tour above stopped (nothing left of it), and started again switched.
    let dir: string | undefined;
    if (demo !== undefined) {
      const tracked = demo.descendants();
      dir = demo.dir;
      await demo.stop();
      expect(survivors(tracked)).toEqual([]);
    }
    demo = await startDemo({ ...(dir ? { dir } : {}), env: WORKSPACE_SWITCH, timeoutMs: DEMO_READY_MS });
    const stack = demo;
    expect(stack.output()).toContain("workspace: worktree");
    const project = join(stack.dir, "project");

    const runIds: string[] = [];
    /** Each run's id → the text its prompt has the agent write. */
    const textOf = new Map<string, string>();
    let background: { command: string; result: Promise<Awaited<ReturnType<typeof runCli>>> }[] = [];
    const outputs = new Map<string, string>();
    const check = (command: string, result: Awaited<ReturnType<typeof runCli>>) => {
      expect(result.code, `${command}\n--- stdout\n${result.stdout}\n--- stderr\n${result.stderr}`).toBe(0);
      const id = /wc_agent_run_[a-z0-9]+/.exec(result.stdout)?.[0];
      if (command.startsWith("npx webcodex run ") && id !== undefined) {
        runIds.push(id);
        textOf.set(id, /text=(\S+?)"/.exec(command)?.[1] ?? "");
      }
      outputs.set(command, result.stdout);
    };
    for (const line of tour) {
      if (line === "wait") {
        for (const b of background) check(b.command, await b.result);
        background = [];
      } else if (line.startsWith("npx webcodex ")) {
        const command = line.replace(/\s*&$/, "");
        const args = shellWords(command)
          .slice(2)
          .map((w) => {
            if (w !== "RUN_ID") return w;
            expect(runIds.at(-1), `${line} needs an earlier run`).toBeDefined();
            return runIds.at(-1)!;
          });
        const result = runCli(args, stack);
        if (line.endsWith("&")) background.push({ command, result });
        else check(command, await result);
      } else if (line.startsWith("git -C .webcodex/demo/project ")) {
        const args = shellWords(line).slice(3);
        outputs.set(line, execFileSync("git", ["-C", project, ...args], { encoding: "utf8", timeout: 30_000 }));
      } else {
        throw new Error(`the workspaces tour has a line this test does not know how to run: ${line}`);
      }
    }
    expect(background, "every background run waited for").toEqual([]);

    // Two runs at once, each with its own change on its own branch; the project's tree untouched.
    expect(new Set(runIds).size, "two runs").toBe(2);
    expect(existsSync(join(project, "notes.txt")), "the project's tree is untouched").toBe(false);
    expect(new Set(textOf.values()), "the texts the two runs wrote").toEqual(new Set(["first", "second"]));
    for (const runId of runIds) {
      const r = await runCli(["changes", runId, "--patch"], stack);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout).toMatch(
        new RegExp(`webcodex/run/${runId}[\\s\\S]*notes\\.txt[\\s\\S]*\\+${textOf.get(runId)}\\n`),
      );
    }
    // What the tour printed: the last run's change (RUN_ID), applied to the new branch by fast-forward, now on it.
    const last = runIds.at(-1)!;
    const printed = [...outputs.entries()];
    const shown = printed.find(([c]) => c.startsWith("npx webcodex changes "))?.[1] ?? "";
    expect(shown).toContain(`+${textOf.get(last)}\n`);
    const applied = printed.find(([c]) => c.startsWith("npx webcodex apply "))?.[1] ?? "";
    expect(applied).toContain("review fast-forwarded");
    const log = printed.find(([c]) => c.includes(" log "))?.[1] ?? "";
    expect(log.trim().split("\n").length, log).toBeGreaterThanOrEqual(2);
    expect(execFileSync("git", ["-C", project, "show", "review:notes.txt"], { encoding: "utf8" })).toBe(
      `${textOf.get(last)}\n`,
    );
  }, 420_000);
});
