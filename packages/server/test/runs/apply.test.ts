/**
 * apply_coding_agent_changes (issue 41 §2, design §16) through the whole stack: a real Server, a real Runner daemon
 * with a `worktree` project (a real git repository) and the fake agent, called through real MCP clients of both
 * eras. A run's change is brought into a branch by fast-forward (with the files of the checked-out branch) or by a
 * merge commit (ref only, for a branch not checked out); a conflict names the paths and changes nothing; a dirty
 * tree is refused naming its paths; the same key gets the same answer, also after the Runner restarted; another
 * principal's run looks like no run. Paths and contents never reach the Server's state, audit or log.
 */
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Client as ModernClient, StreamableHTTPClientTransport as ModernTransport } from "@modelcontextprotocol/client";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { poll } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";
import { type Stack, startStack } from "../support/stack.js";
import { observeToEnd, ok, type Structured, toolError } from "../support/tool-calls.js";

const ALL = ["coding_agent:run", "project:write", "project:read", "runtime:read"] as const;
const MODERN = "2026-07-28";
const APPLY = "apply_coding_agent_changes";

let stack: Stack;
let alice: Client;
let bob: Client;
let reader: Client;
let modern: ModernClient;
let root: string;

function git(...args: string[]): string {
  return execFileSync("git", ["-c", "user.name=t", "-c", "user.email=t@example.invalid", ...args], {
    cwd: root,
    encoding: "utf8",
  }).trim();
}

const tip = (branch: string) => git("rev-parse", `refs/heads/${branch}`);

beforeAll(async () => {
  stack = await startStack({
    principals: [
      { id: "alice", scopes: [...ALL], projects: ["demo", "plain"] },
      { id: "bob", scopes: [...ALL], projects: ["demo"] },
    ],
    projects: [
      { id: "demo", allow_patch: true, workspace: "worktree" },
      { id: "plain", allow_patch: true },
    ],
    acp: { max_concurrent_runs: 4 },
  });
  root = join(stack.dir, "projects", "demo");
  const aliceToken = await stack.issueToken("alice", [...ALL], ["demo", "plain"]);
  alice = await stack.connect(aliceToken);
  bob = await stack.connect(await stack.issueToken("bob", [...ALL], ["demo"]));
  reader = await stack.connect(await stack.issueToken("alice", ["coding_agent:run"], ["demo"]));
  modern = new ModernClient(
    { name: "webcodex-test-2026", version: "0" },
    { versionNegotiation: { mode: { pin: MODERN } } },
  );
  await modern.connect(
    new ModernTransport(stack.mcpUrl, { requestInit: { headers: { Authorization: `Bearer ${aliceToken}` } } }),
  );
}, 120_000);

afterAll(async () => {
  await modern?.close();
  await stack?.stop();
});

let counter = 0;
const unique = (label: string) => `${label}-${process.pid}-${++counter}`;

/** A completed run of `prompt` on `project` (default demo); its run id. */
async function ranToEnd(prompt: string, project = "demo"): Promise<string> {
  const started = await ok(alice, "start_coding_agent", {
    project_id: project,
    provider_id: "fake",
    idempotency_key: unique("run"),
    prompt,
  });
  const end = await observeToEnd(alice, started.run_id as string);
  expect(end.state).toBe("completed");
  return started.run_id as string;
}

async function modernApply(args: Record<string, unknown>): Promise<Structured> {
  const r = (await modern.callTool({ name: APPLY, arguments: args }, { timeout: 60_000 })) as {
    isError?: boolean;
    structuredContent?: Structured;
  };
  expect(r.isError).toBeFalsy();
  return r.structuredContent as Structured;
}

/** The root is as it was: on main, nothing staged or modified, no merge under way. */
function expectRootUntouched(mainAt: string): void {
  expect(tip("main")).toBe(mainAt);
  expect(git("symbolic-ref", "HEAD")).toBe("refs/heads/main");
  expect(git("status", "--porcelain")).toBe("");
  expect(existsSync(join(root, ".git", "MERGE_HEAD"))).toBe(false);
}

describe("apply_coding_agent_changes through the stack", () => {
  it("fast-forwards the checked-out branch with its files; the same key gets the same answer, also after a Runner restart, on both eras", async () => {
    const path = `${canary("path")}.txt`;
    const text = canary("text");
    const runId = await ranToEnd(`scenario: edit_file path=${path} text=${text}`);
    const before = tip("main");
    const key = unique("apply");

    const first = await ok(alice, APPLY, { run_id: runId, target_branch: "main", idempotency_key: key });
    expect(first).toMatchObject({
      run_id: runId,
      target_branch: "main",
      result: "fast_forward",
      applied: true,
      target_before: before,
    });
    expect(first.target_after).toBe(first.head_commit);
    expect(tip("main")).toBe(first.head_commit);
    // The checked-out branch moved with its files: the run's file is in the tree, and the tree is clean.
    expect(readFileSync(join(root, path), "utf8")).toBe(`${text}\n`);
    expect(git("status", "--porcelain")).toBe("");

    // The same key: the same answer (not "up to date"); another key: the target already has it.
    expect(await ok(alice, APPLY, { run_id: runId, target_branch: "main", idempotency_key: key })).toEqual(first);
    expect(await modernApply({ run_id: runId, target_branch: "main", idempotency_key: key })).toEqual(first);
    const again = await ok(alice, APPLY, { run_id: runId, target_branch: "main", idempotency_key: unique("apply") });
    expect(again).toMatchObject({ result: "up_to_date", applied: false, target_before: first.head_commit });
    expect(again.target_after).toBe(first.head_commit);

    // The same key for another branch is another intent.
    git("branch", "other", before);
    const reused = await toolError(alice, APPLY, { run_id: runId, target_branch: "other", idempotency_key: key });
    expect(reused.code).toBe("idempotency_conflict");
    expect(tip("other")).toBe(before);

    // The answer is the Runner's, durably: a restarted Runner gives it again.
    await stack.stopRunner();
    await stack.startRunner();
    expect(await ok(alice, APPLY, { run_id: runId, target_branch: "main", idempotency_key: key })).toEqual(first);

    // Paths and contents are project content: never in the Server's state (audit included) or its log.
    const audited = async () =>
      (
        await stack.rows<{ outcome: string }>(
          "SELECT outcome FROM mcp_audit WHERE tool = ? AND run_id = ? ORDER BY id",
          [APPLY, runId],
        )
      ).map((r) => r.outcome);
    // Audit rows are written in batches: wait for the last call's.
    await poll(async () => (await audited()).length >= 6, { timeoutMs: 30_000, intervalMs: 100, what: "audit rows" });
    expect(await audited()).toEqual(["ok", "ok", "ok", "ok", "idempotency_conflict", "ok"]);
    const state = await stack.stateText();
    const log = stack.serverLog();
    for (const secret of [path, text, key]) {
      expect(state).not.toContain(secret);
      expect(log).not.toContain(secret);
    }
  }, 240_000);

  it("merges cleanly into a branch that is not checked out, by ref only, leaving the project's tree alone", async () => {
    const mainAt = tip("main");
    git("branch", "feature", mainAt);
    // The feature branch gets a commit of its own (made without checking it out).
    const blob = execFileSync("git", ["hash-object", "-w", "--stdin"], { cwd: root, input: "feature\n" })
      .toString()
      .trim();
    const tree = execFileSync("git", ["mktree"], {
      cwd: root,
      input: `${git("ls-tree", mainAt)}\n100644 blob ${blob}\tfeature.txt\n`,
    })
      .toString()
      .trim();
    const featureAt = git("commit-tree", tree, "-p", mainAt, "-m", "feature");
    git("update-ref", "refs/heads/feature", featureAt);

    const runId = await ranToEnd("scenario: edit_file path=merged.txt text=merged");
    const applied = await ok(alice, APPLY, {
      run_id: runId,
      target_branch: "feature",
      idempotency_key: unique("apply"),
    });
    expect(applied).toMatchObject({ result: "merged", applied: true, target_before: featureAt });
    const merge = applied.target_after as string;
    expect(tip("feature")).toBe(merge);
    expect(git("rev-list", "--parents", "-n", "1", merge).split(" ").slice(1)).toEqual([
      featureAt,
      applied.head_commit,
    ]);
    expect(git("show", `${merge}:merged.txt`)).toBe("merged");
    expect(git("show", `${merge}:feature.txt`)).toBe("feature");
    expectRootUntouched(mainAt);
    expect(existsSync(join(root, "merged.txt"))).toBe(false);
  }, 240_000);

  it("answers a conflict with the conflicting paths and changes nothing; the same key replays the conflict", async () => {
    const runId = await ranToEnd("scenario: edit_file path=README.md text=from-the-run");
    // Meanwhile main changes the same line.
    writeFileSync(join(root, "README.md"), "from-main\n");
    git("commit", "-q", "-am", "main edits README");
    const mainAt = tip("main");
    const indexBefore = git("ls-files", "--stage");
    const key = unique("apply");

    const conflict = await ok(alice, APPLY, { run_id: runId, target_branch: "main", idempotency_key: key });
    expect(conflict).toMatchObject({
      result: "conflict",
      applied: false,
      target_before: mainAt,
      target_after: mainAt,
      conflicts: ["README.md"],
      conflicts_truncated: false,
    });
    expectRootUntouched(mainAt);
    expect(git("ls-files", "--stage")).toBe(indexBefore);
    expect(readFileSync(join(root, "README.md"), "utf8")).toBe("from-main\n");
    expect(await ok(alice, APPLY, { run_id: runId, target_branch: "main", idempotency_key: key })).toEqual(conflict);
  }, 240_000);

  it("refuses a checked-out target with uncommitted work, naming the paths and changing nothing; the same key applies once it is clean", async () => {
    const runId = await ranToEnd("scenario: edit_file path=d.txt text=d");
    const mainAt = tip("main");
    writeFileSync(join(root, "README.md"), "local edit\n");
    writeFileSync(join(root, "scratch.txt"), "untracked\n");
    const key = unique("apply");

    const refused = await toolError(alice, APPLY, { run_id: runId, target_branch: "main", idempotency_key: key });
    expect(refused).toMatchObject({
      code: "apply_refused",
      apply_refusal: "dirty_tree",
      recovery_kind: "fix_input",
      paths: ["README.md", "scratch.txt"],
      paths_truncated: false,
    });
    expect(refused.message).toContain('"README.md"');
    expect(tip("main")).toBe(mainAt);
    expect(readFileSync(join(root, "README.md"), "utf8")).toBe("local edit\n");
    expect(readFileSync(join(root, "scratch.txt"), "utf8")).toBe("untracked\n");
    expect(existsSync(join(root, "d.txt"))).toBe(false);

    git("checkout", "--", "README.md");
    rmSync(join(root, "scratch.txt"));
    const applied = await ok(alice, APPLY, { run_id: runId, target_branch: "main", idempotency_key: key });
    expect(applied).toMatchObject({ result: "fast_forward", applied: true, target_before: mainAt });
    expect(readFileSync(join(root, "d.txt"), "utf8")).toBe("d\n");
  }, 240_000);

  it("refuses precisely: another principal (as no run), a token without project:write, an unknown branch, a branch checked out elsewhere, a running run, a run with no change, a shared project, bad input", async () => {
    const runId = await ranToEnd("scenario: edit_file path=e.txt text=e");
    const args = (extra: Record<string, unknown> = {}) => ({
      run_id: runId,
      target_branch: "main",
      idempotency_key: unique("apply"),
      ...extra,
    });

    const denied = await toolError(bob, APPLY, args());
    const missing = await toolError(bob, APPLY, args({ run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa" }));
    expect(denied.code).toBe("not_found");
    expect(denied.message.replace(runId, "RUN")).toBe(
      missing.message.replace("wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa", "RUN"),
    );

    const scoped = (await toolError(reader, APPLY, args())) as { code: string; missing_scopes?: string[] };
    expect(scoped.code).toBe("forbidden");
    expect(scoped.missing_scopes).toEqual(["project:write"]);

    const unknown = await toolError(alice, APPLY, args({ target_branch: "no-such-branch" }));
    expect(unknown).toMatchObject({
      code: "apply_refused",
      apply_refusal: "unknown_branch",
      recovery_kind: "fix_input",
    });
    expect(unknown.message).toContain("'no-such-branch' names no branch of the project");

    const elsewhere = join(stack.dir, "elsewhere");
    git("worktree", "add", "-q", "-b", "busy", elsewhere, "main");
    const busyAt = tip("busy");
    const checkedOut = await toolError(alice, APPLY, args({ target_branch: "busy" }));
    expect(checkedOut).toMatchObject({ code: "apply_refused", apply_refusal: "checked_out_elsewhere" });
    expect(tip("busy")).toBe(busyAt);

    const running = await ok(alice, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: unique("run"),
      prompt: "scenario: edit_file path=f.txt text=f hold=true",
    });
    const notEnded = await toolError(alice, APPLY, args({ run_id: running.run_id }));
    expect(notEnded).toMatchObject({ code: "apply_refused", apply_refusal: "not_terminal", recovery_kind: "wait" });
    await ok(alice, "cancel_coding_agent", { run_id: running.run_id });
    await observeToEnd(alice, running.run_id as string);

    const idle = await ranToEnd("scenario: hello");
    const nothing = await toolError(alice, APPLY, args({ run_id: idle }));
    expect(nothing).toMatchObject({ code: "apply_refused", apply_refusal: "no_change" });

    const shared = await ranToEnd("scenario: hello", "plain");
    const plain = await toolError(alice, APPLY, args({ run_id: shared }));
    expect(plain).toMatchObject({ code: "apply_refused", apply_refusal: "shared_project", recovery_kind: "none" });
    expect(plain.message).toContain('workspace = "shared"');

    const badBranch = await toolError(alice, APPLY, args({ target_branch: "--force" }));
    expect(badBranch.code).toBe("invalid_input");
    expect(badBranch.message).toContain("target_branch");
    const noKey = await toolError(alice, APPLY, { run_id: runId, target_branch: "main" });
    expect(noKey.code).toBe("invalid_input");
    expect(noKey.message).toContain("idempotency_key");
  }, 240_000);
});
