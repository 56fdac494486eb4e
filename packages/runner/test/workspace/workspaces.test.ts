/**
 * Workspaces (design §16, issue 41) on the Runner, over real git repositories and the real fake agent: a
 * `worktree` project's run works in a git worktree of its own from `base_ref`, its change (the agent's commits
 * plus one commit of what it left) is recorded on `webcodex/run/<run_id>` before its terminal is reported, and
 * `changes` pages it back; start-up records a change a previous process left unrecorded. Config checks first.
 */
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { RunChanges } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import { FAKE_AGENT_BIN, poll, RUNNER_BIN, readLedger } from "../../../../scripts/test-support/index.js";
import { ConfigError, parseConfig, type RunnerConfig } from "../../src/config/config.js";
import type { RunManager } from "../../src/runs/manager.js";
import { openDispatchStore } from "../../src/store/open.js";
import { addWorktree, recordChange, runBranch } from "../../src/workspace/worktree.js";
import { makeWorkspace, newManager, newRunId, runToEnd, startRequest, type Workspace } from "../support/harness.js";

const WAIT = { timeoutMs: 60_000, intervalMs: 50, what: "" };

function git(cwd: string, ...args: string[]): string {
  return execFileSync("git", ["-c", "user.name=t", "-c", "user.email=t@example.invalid", ...args], {
    cwd,
    encoding: "utf8",
  }).trim();
}

/** A project repository with one commit (README and src/math.js) and a tag `v1` on it. */
function initRepo(ws: Workspace): string {
  git(ws.projectRoot, "init", "-q", "-b", "main");
  writeFileSync(join(ws.projectRoot, "README.md"), "demo\n");
  writeFileSync(join(ws.projectRoot, ".gitignore"), "ignored.log\n");
  git(ws.projectRoot, "add", "-A");
  git(ws.projectRoot, "commit", "-q", "-m", "initial");
  git(ws.projectRoot, "tag", "v1");
  return git(ws.projectRoot, "rev-parse", "HEAD");
}

function configText(ws: Workspace, project: string, acp = ""): string {
  return [
    "[runner]",
    `state_dir = ${JSON.stringify(join(ws.dir, "state"))}`,
    "[[projects]]",
    'id = "demo"',
    `root = ${JSON.stringify(ws.projectRoot)}`,
    "allow_patch = true",
    project,
    "[acp]",
    "agents_share_runner_user = true",
    "max_concurrent_runs = 4",
    "cancel_grace_secs = 5",
    acp,
    "[[acp.agents]]",
    'id = "fake"',
    `executable = ${JSON.stringify(FAKE_AGENT_BIN)}`,
    `args = ${JSON.stringify(["--ledger", ws.ledger])}`,
    "[acp.agents.env_from_env]",
    'PATH = "PATH"',
    "",
  ].join("\n");
}

function load(ws: Workspace, project: string, acp = ""): RunnerConfig {
  const file = join(ws.dir, "runner.toml");
  const text = configText(ws, project, acp);
  writeFileSync(file, text);
  return parseConfig(text, file);
}

function configErrors(ws: Workspace, project: string, acp = ""): readonly string[] {
  try {
    load(ws, project, acp);
  } catch (error) {
    if (error instanceof ConfigError) return error.errors;
    throw error;
  }
  return [];
}

const workspaces: Workspace[] = [];
const managers: RunManager[] = [];
afterEach(async () => {
  for (const m of managers.splice(0)) await m.close();
  for (const ws of workspaces.splice(0)) ws.cleanup();
});

function fresh(): Workspace {
  const ws = makeWorkspace();
  workspaces.push(ws);
  return ws;
}

function worktreeManager(ws: Workspace, acp = "") {
  const config = load(ws, 'workspace = "worktree"', acp);
  const made = newManager(config, { workspacesDir: join(ws.dir, "worktrees") });
  managers.push(made.manager);
  return { config, ...made };
}

async function allChanges(
  manager: RunManager,
  runId: string,
  maxBytes: number,
): Promise<{ first: RunChanges; diff: string; pages: number }> {
  let diff = "";
  let pages = 0;
  let cursor = 0;
  let first: RunChanges | null = null;
  for (;;) {
    const res = await manager.changes(runId, cursor, maxBytes);
    if (!res?.ok) throw new Error(`changes failed: ${JSON.stringify(res)}`);
    first ??= res.changes;
    pages += 1;
    expect(Buffer.byteLength(JSON.stringify(res.changes.diff))).toBeLessThanOrEqual(maxBytes);
    diff += res.changes.diff;
    if (res.changes.next_cursor === undefined) return { first, diff, pages };
    cursor = Number(res.changes.next_cursor);
  }
}

describe("workspace config", () => {
  it("refuses worktree on a root that is not a git repository, has no commit, or is not the repository's top", () => {
    const ws = fresh();
    const notRepo = configErrors(ws, 'workspace = "worktree"');
    expect(notRepo).toHaveLength(1);
    expect(notRepo[0]).toContain("projects[0].workspace:");
    expect(notRepo[0]).toContain("to be a git repository; run `git init` there and commit");

    git(ws.projectRoot, "init", "-q");
    const noCommit = configErrors(ws, 'workspace = "worktree"');
    expect(noCommit[0]).toContain("projects[0].workspace:");
    expect(noCommit[0]).toContain("needs at least one commit");

    initRepo(ws);
    expect(configErrors(ws, 'workspace = "worktree"')).toEqual([]);
    const sub = join(ws.projectRoot, "src");
    const text = configText(ws, 'workspace = "worktree"').replace(
      `root = ${JSON.stringify(ws.projectRoot)}`,
      `root = ${JSON.stringify(sub)}`,
    );
    let inside: readonly string[] = [];
    try {
      parseConfig(text, join(ws.dir, "runner.toml"));
    } catch (error) {
      inside = (error as ConfigError).errors;
    }
    expect(inside.join("\n")).toContain("needs the root to be the top of its git repository");

    // `check` says the same (exit 2), and names the mode of a project it accepts.
    const file = join(ws.dir, "runner.toml");
    writeFileSync(file, text);
    const refused = spawnSync(process.execPath, [RUNNER_BIN, "check", "--config", file], { encoding: "utf8" });
    expect(refused.status).toBe(2);
    expect(refused.stderr).toContain('projects[0].workspace: workspace = "worktree" needs the root to be the top');
    load(ws, 'workspace = "worktree"');
    const accepted = spawnSync(process.execPath, [RUNNER_BIN, "check", "--config", file], { encoding: "utf8" });
    expect(accepted.status).toBe(0);
    expect(accepted.stdout).toContain("projects: demo (a worktree per run)");
  });

  it("refuses worktree next to a run_as agent without a workspaces_dir apart from the state dir and roots, and a malformed workspace_author", () => {
    const ws = fresh();
    initRepo(ws);
    const file = join(ws.dir, "runner.toml");
    const text = configText(ws, 'workspace = "worktree"').replace('id = "fake"', 'id = "fake"\nrun_as = "nobody"');
    let errors: readonly string[] = [];
    try {
      parseConfig(text, file);
    } catch (error) {
      errors = (error as ConfigError).errors;
    }
    expect(errors.join("\n")).toContain(
      'runner.workspaces_dir: projects[0].workspace = "worktree" with run_as agents (acp.agents[0].run_as) needs runner.workspaces_dir',
    );
    // Set, it must be apart from the state dir and every root.
    for (const [where, says] of [
      [join(ws.dir, "state", "ws"), "must be apart from runner.state_dir"],
      [join(ws.projectRoot, "ws"), "must be apart from every project root"],
    ] as const) {
      try {
        parseConfig(text.replace("[runner]", `[runner]\nworkspaces_dir = ${JSON.stringify(where)}`), file);
        errors = [];
      } catch (error) {
        errors = (error as ConfigError).errors;
      }
      expect(errors.join("\n")).toContain(says);
    }
    expect(configErrors(ws, 'workspace = "worktree"', 'workspace_author = "no email"').join("\n")).toContain(
      'acp.workspace_author: must be "Name <email>"',
    );
    expect(load(ws, "").projects[0]?.workspace).toBe("shared");
  });
});

describe("worktree runs", () => {
  it("works in its own worktree and records what it left as one commit by the configured author, before its terminal", async () => {
    const ws = fresh();
    const base = initRepo(ws);
    const { manager, store } = worktreeManager(ws, 'workspace_author = "Review Bot <bot@example.invalid>"');
    const prompt = "scenario: edit_file path=src/new.txt text=from-the-agent";
    let terminalHead: string | undefined;
    manager.onUpdate((run) => {
      if (run.state === "completed") terminalHead ??= run.workspace?.head_commit ?? "none";
    });
    const { run } = await runToEnd(manager, prompt);

    expect(run.state).toBe("completed");
    expect(run.workspace?.mode).toBe("worktree");
    expect(run.workspace?.base_commit).toBe(base);
    expect(run.workspace?.branch).toBe(runBranch(run.run_id));
    const head = run.workspace?.head_commit ?? "";
    expect(head).toMatch(/^[0-9a-f]{40}$/);
    // The first update that said "completed" already carried the head: recorded before the terminal.
    expect(terminalHead).toBe(head);
    expect(store.workspace(run.run_id)?.head_commit).toBe(head);

    // The project's own tree is untouched; the change is on the run's branch, by the configured identity.
    expect(existsSync(join(ws.projectRoot, "src", "new.txt"))).toBe(false);
    expect(git(ws.projectRoot, "status", "--porcelain")).toBe("");
    expect(git(ws.projectRoot, "rev-parse", runBranch(run.run_id))).toBe(head);
    expect(git(ws.projectRoot, "show", `${head}:src/new.txt`)).toBe("from-the-agent");
    expect(git(ws.projectRoot, "log", "-1", "--format=%an <%ae>|%cn <%ce>", head)).toBe(
      "Review Bot <bot@example.invalid>|Review Bot <bot@example.invalid>",
    );
    const message = git(ws.projectRoot, "log", "-1", "--format=%B", head);
    expect(message).toContain(run.run_id);
    expect(message).not.toContain("from-the-agent");
    expect(message).not.toContain("scenario");
    expect(git(ws.projectRoot, "rev-list", "--count", `${base}..${head}`)).toBe("1");

    // The agent's session/new named the worktree, not the project root; once recorded, the worktree is kept for
    // workspace_keep_secs (the keep test below sweeps it) and holds the recorded head.
    const worktree = join(ws.dir, "worktrees", run.run_id);
    expect(existsSync(worktree)).toBe(true);
    expect(git(worktree, "status", "--porcelain")).toBe("");
    expect(git(worktree, "rev-parse", "HEAD")).toBe(head);

    const changes = await manager.changes(run.run_id, 0, 64 * 1024);
    expect(changes?.ok).toBe(true);
    if (!changes?.ok) return;
    expect(changes.changes).toMatchObject({
      run_id: run.run_id,
      recorded: true,
      base_commit: base,
      head_commit: head,
      branch: runBranch(run.run_id),
      files: [{ path: "src/new.txt", status: "added", insertions: 1, deletions: 0, binary: false }],
      files_truncated: false,
      diff_truncated: false,
    });
    expect(changes.changes.diff).toContain("+from-the-agent");
    expect(changes.changes.next_cursor).toBeUndefined();
  });

  it("never runs the project's hooks or fsmonitor as the Runner while making the worktree and recording the change", async () => {
    const ws = fresh();
    initRepo(ws);
    const canaryFile = join(ws.dir, "ran-as-runner");
    const script = join(ws.dir, "plant.sh");
    writeFileSync(script, `#!/bin/sh\necho "$0 $*" >> ${canaryFile}\nexit 0\n`, { mode: 0o755 });
    for (const hook of ["post-checkout", "pre-commit", "commit-msg", "post-commit", "reference-transaction"]) {
      writeFileSync(join(ws.projectRoot, ".git", "hooks", hook), `#!/bin/sh\nexec ${script} ${hook}\n`, {
        mode: 0o755,
      });
    }
    git(ws.projectRoot, "config", "core.fsmonitor", script);
    const { manager } = worktreeManager(ws);
    const { run } = await runToEnd(manager, "scenario: edit_file path=a.txt text=a");
    expect(run.state).toBe("completed");
    expect(run.workspace?.head_commit).toMatch(/^[0-9a-f]{40}$/);
    const changes = await manager.changes(run.run_id, 0, 4096);
    expect(changes?.ok).toBe(true);
    expect(existsSync(canaryFile)).toBe(false);
  });

  it("records what the agent left beside a named pipe it made: the pipe is not content, and nothing waits on it", async () => {
    const ws = fresh();
    const base = initRepo(ws);
    const runId = newRunId();
    const branch = runBranch(runId);
    const dir = join(ws.dir, "worktrees", runId);
    await addWorktree(ws.projectRoot, dir, branch, base);
    writeFileSync(join(dir, "left.txt"), "left\n");
    // Opening a FIFO for reading blocks until a writer comes: a recording that read it would never end.
    execFileSync("mkfifo", [join(dir, "pipe")]);
    execFileSync("mkfifo", [join(dir, "src-pipe")]);

    const head = await recordChange(ws.projectRoot, dir, runId, branch, base, {
      name: "R",
      email: "r@example.invalid",
    });
    expect(git(ws.projectRoot, "rev-parse", branch)).toBe(head);
    expect(git(ws.projectRoot, "rev-parse", `${head}~1`)).toBe(base);
    // The change is the file alone: neither pipe is in the commit.
    expect(git(ws.projectRoot, "diff", "--name-only", base, head)).toBe("left.txt");
    expect(git(ws.projectRoot, "show", `${head}:left.txt`)).toBe("left");
  });

  it("keeps the agent's own commits and adds one for what it left; .gitignore is respected", async () => {
    const ws = fresh();
    const base = initRepo(ws);
    const { manager } = worktreeManager(ws);
    const committed = await runToEnd(manager, "scenario: git_work name=committed.txt");
    expect(committed.run.state).toBe("completed");
    const head1 = committed.run.workspace?.head_commit ?? "";
    // The agent's commit only: nothing was left to commit.
    expect(git(ws.projectRoot, "rev-list", "--count", `${base}..${head1}`)).toBe("1");
    expect(git(ws.projectRoot, "log", "-1", "--format=%an", head1)).toBe("fake");

    const ignored = await runToEnd(manager, "scenario: edit_file path=ignored.log text=noise");
    const head2 = ignored.run.workspace?.head_commit ?? "";
    expect(head2).toBe(base);
    const res = await manager.changes(ignored.run.run_id, 0, 4096);
    expect(res?.ok && res.changes.files).toEqual([]);
  });

  it("starts from base_ref, and ends failed with a precise message when base_ref names nothing or the project is shared", async () => {
    const ws = fresh();
    const v1 = initRepo(ws);
    writeFileSync(join(ws.projectRoot, "later.txt"), "later\n");
    git(ws.projectRoot, "add", "-A");
    git(ws.projectRoot, "commit", "-q", "-m", "later");
    const { manager } = worktreeManager(ws);

    const fromTag = await runToEnd(manager, "scenario: edit_file path=a.txt text=a", { base_ref: "v1" });
    expect(fromTag.run.workspace?.base_commit).toBe(v1);
    const res = await manager.changes(fromTag.run.run_id, 0, 4096);
    expect(res?.ok && res.changes.files.map((f) => f.path)).toEqual(["a.txt"]);

    const unknown = await runToEnd(manager, "scenario: hello", { base_ref: "no-such-branch" });
    expect(unknown.run).toMatchObject({
      state: "failed",
      execution_state: "not_started",
      failure_kind: "workspace_failed",
      recovery_kind: "fix_input",
    });
    expect(unknown.run.message).toContain("base_ref names no branch, tag or commit of the project.");
    expect(readLedger(ws.ledger).filter((l) => l.event === "prompt")).toHaveLength(1);

    const shared = fresh();
    initRepo(shared);
    const sharedManager = newManager(load(shared, ""), { workspacesDir: join(shared.dir, "worktrees") }).manager;
    managers.push(sharedManager);
    const refused = await runToEnd(sharedManager, "scenario: hello", { base_ref: "main" });
    expect(refused.run.failure_kind).toBe("workspace_failed");
    expect(refused.run.message).toContain('base_ref is only for a project with workspace = "worktree"');
    expect(refused.run.workspace).toBeUndefined();
    expect(await sharedManager.changes(refused.run.run_id, 0, 4096)).toMatchObject({
      ok: false,
      code: "invalid_request",
    });
  });

  it("pages a long diff within max_bytes; the pages put together are the whole diff", async () => {
    const ws = fresh();
    initRepo(ws);
    const { manager } = worktreeManager(ws);
    const { run } = await runToEnd(
      manager,
      `scenario: edit_file path=big.txt text="a 'quoted' \\ tab\t é ✎" lines=400`,
    );
    expect(run.state).toBe("completed");
    const whole = await manager.changes(run.run_id, 0, 256 * 1024);
    if (!whole?.ok) throw new Error("no changes");
    expect(whole.changes.next_cursor).toBeUndefined();
    const paged = await allChanges(manager, run.run_id, 1024);
    expect(paged.pages).toBeGreaterThan(3);
    expect(paged.diff).toBe(whole.changes.diff);
    expect(paged.first.files).toEqual(whole.changes.files);
  });

  it("two concurrent runs editing the same file each record their own change", async () => {
    const ws = fresh();
    const base = initRepo(ws);
    const { manager } = worktreeManager(ws);
    const a = startRequest(manager, "scenario: edit_file path=README.md text=from-a hold=true");
    const b = startRequest(manager, "scenario: edit_file path=README.md text=from-b hold=true");
    expect((await manager.start(a)).ok).toBe(true);
    expect((await manager.start(b)).ok).toBe(true);
    // Both agents have written while both runs are live.
    await poll(() => readLedger(ws.ledger).filter((l) => l.event === "file_edited").length === 2, {
      ...WAIT,
      what: "both edits",
    });
    await manager.cancel(a.run_id);
    await manager.cancel(b.run_id);
    await Promise.all([manager.whenSettled(a.run_id), manager.whenSettled(b.run_id)]);
    for (const [req, text] of [
      [a, "from-a"],
      [b, "from-b"],
    ] as const) {
      const run = manager.sync(req.run_id, 0, 0)?.run;
      expect(run?.state).toBe("cancelled");
      const head = run?.workspace?.head_commit ?? "";
      expect(git(ws.projectRoot, "show", `${head}:README.md`)).toBe(text);
      expect(git(ws.projectRoot, "rev-parse", `${head}~1`)).toBe(base);
    }
    expect(readFileSync(join(ws.projectRoot, "README.md"), "utf8")).toBe("demo\n");
  });
});

describe("workspace keep time", () => {
  it("keeps an ended run's worktree for workspace_keep_secs, then sweeps it (the branch and its change stay); a running run's worktree is never swept", async () => {
    const ws = fresh();
    initRepo(ws);
    const config = load(ws, 'workspace = "worktree"');
    expect(config.runner.workspaceKeepSecs).toBe(600);
    let now = Date.parse("2026-01-01T00:00:00Z");
    const { manager } = newManager(config, { workspacesDir: join(ws.dir, "worktrees"), now: () => new Date(now) });
    managers.push(manager);
    const ended = (await runToEnd(manager, "scenario: edit_file path=kept.txt text=kept")).run;
    const endedDir = join(ws.dir, "worktrees", ended.run_id);
    const head = ended.workspace?.head_commit ?? "";
    expect(existsSync(endedDir)).toBe(true);

    const held = startRequest(manager, "scenario: edit_file path=held.txt text=held hold=true");
    expect((await manager.start(held)).ok).toBe(true);
    await poll(() => readLedger(ws.ledger).filter((l) => l.event === "file_edited").length === 2, {
      ...WAIT,
      what: "the held run's edit",
    });
    const heldDir = join(ws.dir, "worktrees", held.run_id);

    // Before its keep time nothing goes; after it, the ended run's worktree goes and the running one's stays.
    now += 599_000;
    expect(await manager.sweepWorkspaces()).toBe(0);
    expect(existsSync(endedDir)).toBe(true);
    now += 2_000;
    expect(await manager.sweepWorkspaces()).toBe(1);
    expect(existsSync(endedDir)).toBe(false);
    expect(git(ws.projectRoot, "worktree", "list", "--porcelain")).not.toContain(ended.run_id);
    expect(git(ws.projectRoot, "rev-parse", runBranch(ended.run_id))).toBe(head);
    expect(git(ws.projectRoot, "show", `${head}:kept.txt`)).toBe("kept");
    expect(readFileSync(join(heldDir, "held.txt"), "utf8")).toBe("held\n");

    // The held run ends: its worktree is kept from then on, and swept after its own keep time.
    await manager.cancel(held.run_id);
    await manager.whenSettled(held.run_id);
    expect(await manager.sweepWorkspaces()).toBe(0);
    expect(existsSync(heldDir)).toBe(true);
    now += 601_000;
    expect(await manager.sweepWorkspaces()).toBe(1);
    expect(existsSync(heldDir)).toBe(false);
  });

  it("removes a worktree at once with workspace_keep_secs = 0, and refuses a negative keep time", async () => {
    const ws = fresh();
    initRepo(ws);
    const file = join(ws.dir, "runner.toml");
    const text = configText(ws, 'workspace = "worktree"').replace("[runner]\n", "[runner]\nworkspace_keep_secs = 0\n");
    writeFileSync(file, text);
    const config = parseConfig(text, file);
    expect(config.runner.workspaceKeepSecs).toBe(0);
    const { manager } = newManager(config, { workspacesDir: join(ws.dir, "worktrees") });
    managers.push(manager);
    const run = (await runToEnd(manager, "scenario: edit_file path=gone.txt text=gone")).run;
    expect(run.workspace?.head_commit).toMatch(/^[0-9a-f]{40}$/);
    expect(existsSync(join(ws.dir, "worktrees", run.run_id))).toBe(false);

    const bad = configText(ws, "").replace("[runner]\n", "[runner]\nworkspace_keep_secs = -1\n");
    expect(() => parseConfig(bad, file)).toThrow(/runner\.workspace_keep_secs/);
  });
});

describe("workspace recovery", () => {
  it("records at start-up the change a previous process left unrecorded, and removes leftover worktrees", async () => {
    const ws = fresh();
    const base = initRepo(ws);
    const config = load(ws, 'workspace = "worktree"');
    const stateDir = mkdtempSync(join(tmpdir(), "wc-runner-store-"));
    const dir = join(ws.dir, "worktrees");
    // What a crash leaves: an admitted run with its workspace recorded, its worktree edited, no change recorded.
    const first = openDispatchStore({ stateDir }).store;
    const runId = "wc_agent_run_abcdefghijklmnopqrstuvwxyz";
    first.admit({
      run_id: runId,
      intent_fingerprint: "f".repeat(64),
      project_id: "demo",
      provider_id: "fake",
      provider_instance_id: "pi_aaaaaaaaaaaaaaaaaaaa",
      agent_instance_id: "ai_aaaaaaaaaaaaaaaaaaaa",
      created_at: new Date().toISOString(),
    });
    first.recordWorkspace(runId, { branch: runBranch(runId), base_commit: base });
    mkdirSync(dir, { recursive: true });
    git(ws.projectRoot, "worktree", "add", "-q", "-b", runBranch(runId), join(dir, runId), base);
    writeFileSync(join(dir, runId, "left.txt"), "left behind\n");
    // And an orphan: a worktree directory nobody recorded.
    const orphan = "wc_agent_run_zyxwvutsrqponmlkjihgfedcba";
    git(ws.projectRoot, "worktree", "add", "-q", "--detach", join(dir, orphan), base);
    first.close();

    const store = openDispatchStore({ stateDir }).store;
    const { manager } = newManager(config, { store, workspacesDir: dir });
    managers.push(manager);
    // Both worktrees go: the recorded run's (no keep time across a restart) and the orphan.
    expect(await manager.recoverWorkspaces()).toEqual({ recorded: 1, removed: 2, pending: 0 });
    const head = store.workspace(runId)?.head_commit ?? "";
    expect(git(ws.projectRoot, "show", `${head}:left.txt`)).toBe("left behind");
    expect(existsSync(join(dir, runId))).toBe(false);
    expect(existsSync(join(dir, orphan))).toBe(false);
    // (A spare the restarted Runner makes once recovered may be listed: workspace/spares.ts.)
    const listed = git(ws.projectRoot, "worktree", "list");
    expect(listed).not.toContain(join(dir, runId));
    expect(listed).not.toContain(join(dir, orphan));
  });
  it("records no change for a worktree whose `git worktree add` was killed mid-checkout, its stale lock removed", async () => {
    const ws = fresh();
    const base = initRepo(ws);
    const config = load(ws, 'workspace = "worktree"');
    const stateDir = mkdtempSync(join(tmpdir(), "wc-runner-store-"));
    const dir = join(ws.dir, "worktrees");
    const first = openDispatchStore({ stateDir }).store;
    const runId = "wc_agent_run_abcdefghijklmnopqrstuvwxyz";
    first.admit({
      run_id: runId,
      intent_fingerprint: "f".repeat(64),
      project_id: "demo",
      provider_id: "fake",
      provider_instance_id: "pi_aaaaaaaaaaaaaaaaaaaa",
      agent_instance_id: "ai_aaaaaaaaaaaaaaaaaaaa",
      created_at: new Date().toISOString(),
    });
    first.recordWorkspace(runId, { branch: runBranch(runId), base_commit: base });
    mkdirSync(dir, { recursive: true });
    git(ws.projectRoot, "worktree", "add", "-q", "-b", runBranch(runId), join(dir, runId), base);
    first.close();
    // What `git worktree add` killed during its checkout leaves: `locked` still "initializing", the checkout's
    // index lock (old: its git is long gone), and only part of the files.
    const admin = join(ws.projectRoot, ".git", "worktrees", runId);
    writeFileSync(join(admin, "locked"), "initializing");
    const lock = join(admin, "index.lock");
    writeFileSync(lock, "DIRC");
    const old = (Date.now() - 10 * 60_000) / 1000;
    utimesSync(lock, old, old);
    const tracked = git(join(dir, runId), "ls-files").split("\n").filter(Boolean);
    expect(tracked.length).toBeGreaterThan(0);
    for (const path of tracked) rmSync(join(dir, runId, path), { force: true });

    const store = openDispatchStore({ stateDir }).store;
    const { manager } = newManager(config, { store, workspacesDir: dir });
    managers.push(manager);
    expect(await manager.recoverWorkspaces()).toEqual({ recorded: 1, removed: 1, pending: 0 });
    // The agent never ran there: no change, and never a commit deleting what was not checked out yet.
    expect(store.workspace(runId)?.head_commit).toBe(base);
    expect(git(ws.projectRoot, "rev-parse", runBranch(runId))).toBe(base);
    expect(existsSync(lock)).toBe(false);
    expect(existsSync(join(dir, runId))).toBe(false);
  });
});
