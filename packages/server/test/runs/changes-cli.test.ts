/**
 * Issue 41 §2: `webcodex changes RUN_ID [--patch]` and `webcodex apply RUN_ID --to BRANCH` (the CLI binary, over
 * MCP) against a real Server, a real Runner with a `worktree` project (a real git repository) and the fake agent.
 */
import { execFile, execFileSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CLI_BIN } from "../../../../scripts/test-support/index.js";
import { type Stack, startStack } from "../support/stack.js";
import { observeToEnd, ok } from "../support/tool-calls.js";

const SCOPES = ["coding_agent:run", "project:write", "project:read"] as const;
const exec = promisify(execFile);

let stack: Stack;
let alice: Client;
let env: NodeJS.ProcessEnv;
let root: string;

const git = (...args: string[]) =>
  execFileSync("git", ["-c", "user.name=t", "-c", "user.email=t@example.invalid", ...args], {
    cwd: root,
    encoding: "utf8",
  }).trim();

beforeAll(async () => {
  stack = await startStack({
    principals: [{ id: "alice", scopes: [...SCOPES], projects: ["demo"] }],
    projects: [{ id: "demo", allow_patch: true, workspace: "worktree" }],
  });
  root = join(stack.dir, "projects", "demo");
  const token = await stack.issueToken("alice", [...SCOPES], ["demo"]);
  alice = await stack.connect(token);
  env = { ...process.env, WEBCODEX_URL: stack.mcpUrl.href, WEBCODEX_TOKEN: token, NO_COLOR: "1" };
}, 120_000);

afterAll(async () => {
  await stack?.stop();
});

async function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await exec(process.execPath, [CLI_BIN, ...args], { env, timeout: 60_000 });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

let counter = 0;
async function ranToEnd(prompt: string): Promise<string> {
  const started = await ok(alice, "start_coding_agent", {
    project_id: "demo",
    provider_id: "fake",
    idempotency_key: `cli-${process.pid}-${++counter}`,
    prompt,
  });
  expect((await observeToEnd(alice, started.run_id as string)).state).toBe("completed");
  return started.run_id as string;
}

describe("webcodex changes / apply (CLI over MCP)", () => {
  it("lists a run's files, prints its diff with --patch (terminal controls escaped), and applies it with the same answer for the same --key", async () => {
    const runId = await ranToEnd("scenario: edit_file path=notes/todo.txt text=\u001b[2Jcleared lines=3");

    const listed = await cli(["changes", runId]);
    expect(listed.code, listed.stderr).toBe(0);
    expect(listed.stdout).toContain(`webcodex/run/${runId}`);
    expect(listed.stdout).toMatch(/^ {2}A notes\/todo\.txt +\+3 -0$/m);
    expect(listed.stdout).toContain("1 file changed, +3 -0");
    expect(listed.stdout).not.toContain("+++");

    const patch = await cli(["changes", runId, "--patch"]);
    expect(patch.code, patch.stderr).toBe(0);
    expect(patch.stdout).toContain("+++ b/notes/todo.txt");
    expect(patch.stdout).toContain("+\\x1b[2Jcleared");
    expect(patch.stdout).not.toContain("\u001b");

    const json = await cli(["changes", runId, "--patch", "--json"]);
    const lines = json.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines[0]).toMatchObject({ type: "changes", run_id: runId, recorded: true });
    expect(
      lines
        .filter((l) => l.type === "diff")
        .map((l) => l.text as string)
        .join(""),
    ).toContain("+\u001b[2Jcleared");

    const mainAt = git("rev-parse", "main");
    const applied = await cli(["apply", runId, "--to", "main", "--key", "cli-apply-1"]);
    expect(applied.code, applied.stderr).toBe(0);
    expect(applied.stdout).toContain(`main fast-forwarded to`);
    expect(git("rev-parse", "main")).not.toBe(mainAt);
    expect(readFileSync(join(root, "notes", "todo.txt"), "utf8")).toBe("\u001b[2Jcleared\n".repeat(3));
    const again = await cli(["apply", runId, "--to", "main", "--key", "cli-apply-1", "--json"]);
    expect(JSON.parse(again.stdout)).toMatchObject({ type: "apply", result: "fast_forward", key: "cli-apply-1" });
    const fresh = await cli(["apply", runId, "--to", "main"]);
    expect(fresh.code).toBe(0);
    expect(fresh.stdout).toContain("main already contains run");
    expect(fresh.stdout).toMatch(/key: cli-apply-\S+ {2}\(the same --key gets the same answer\)/);
  }, 240_000);

  it("exits 1 on a conflict naming the paths, and on a refused dirty tree naming its paths; usage errors exit 2", async () => {
    const runId = await ranToEnd("scenario: edit_file path=README.md text=run");
    writeFileSync(join(root, "README.md"), "main\n");
    git("commit", "-q", "-am", "main");
    const conflict = await cli(["apply", runId, "--to", "main"]);
    expect(conflict.code).toBe(1);
    expect(conflict.stdout).toContain("does not merge cleanly into main; nothing was changed");
    expect(conflict.stdout).toMatch(/^ {2}README\.md$/m);

    const other = await ranToEnd("scenario: edit_file path=x.txt text=x");
    writeFileSync(join(root, "dirty.txt"), "uncommitted\n");
    const dirty = await cli(["apply", other, "--to", "main"]);
    expect(dirty.code).toBe(1);
    expect(dirty.stderr).toContain("checked out in the project's tree, which has uncommitted work");
    expect(dirty.stderr).toContain('"dirty.txt"');
    rmSync(join(root, "dirty.txt"));

    const noBranch = await cli(["apply", other]);
    expect(noBranch.code).toBe(2);
    expect(noBranch.stderr).toContain("missing --to BRANCH");
    const help = await cli(["apply", "--help"]);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain("webcodex apply RUN_ID|TASK_ID --to BRANCH [--key K]");
  }, 240_000);
});
