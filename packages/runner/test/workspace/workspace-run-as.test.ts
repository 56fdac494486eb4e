/**
 * Worktree runs under run_as (issue 41 §1, issue 39 §2, design §16), with the real Runner, the real fake agent and
 * two OS users created for the test: each run works in a repository its pool user owns (0700) in the Runner's
 * `workspaces_dir`, the project's repository stays the operator's; one caller's run plants `core.fsmonitor`,
 * `core.hooksPath`, an `include.path` and a filter/textconv driver in every git config it can write, a hook of
 * every kind in every hooks dir it can write and `filter=planted` in every attributes file, and neither another
 * caller's concurrent and later runs (git status, add, commit), nor the Runner recording that run's change,
 * reading it back or applying it into the project's checked-out branch, ever runs any of it; the planting caller's
 * own runs still run git normally, and two callers share the project without `shared_between_callers`.
 *
 * Creating users and switching to them needs root (CI runs the suite as root): as any other user this file's tests
 * are skipped, and the describe title says why.
 */
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { type LedgerLine, poll, readLedger } from "../../../../scripts/test-support/index.js";
import { parseConfig, type RunnerConfig } from "../../src/config/config.js";
import { FilePoolBindings } from "../../src/process/user-bindings.js";
import type { RunManager } from "../../src/runs/manager.js";
import { openDispatchStore } from "../../src/store/open.js";
import { addWorktree, recordChange, runBranch } from "../../src/workspace/worktree.js";
import { newManager, newRunId, runToEnd, startRequest } from "../support/harness.js";
import {
  agentCopy,
  createTestUser,
  IS_ROOT,
  removePoolFixture,
  sharedTestDir,
  type TestUser,
} from "../support/test-user.js";

/** Longest a test waits for a live run's ledger line. */
const LEDGER_WAIT_MS = 60_000;
/** Longest one test may take (several runs as pool users on a loaded machine: 3x slower). */
const TEST_TIMEOUT_MS = 300_000;
const ALICE = "tn_aaaaaaaaaaaaaaaaaaaaaaaaaa";
const BOB = "tn_bbbbbbbbbbbbbbbbbbbbbbbbbb";

interface Ctx {
  users: [TestUser, TestUser];
  agent: ReturnType<typeof agentCopy>;
  dir: string;
  ledger: string;
  repo: string;
  plants: string;
  workspaces: string;
  config: RunnerConfig;
  /** The same Runner with `[acp] sandbox = "none"`: the run's own `.git/config` and hooks are writable to it. */
  unsandboxed: RunnerConfig;
}
let ctx: Ctx;

const git = (...args: string[]) =>
  execFileSync("git", ["-C", ctx.repo, ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim();

function ledgerLine(from: number, match: (l: LedgerLine) => boolean): Promise<LedgerLine> {
  return poll(() => readLedger(ctx.ledger).slice(from).find(match), {
    timeoutMs: LEDGER_WAIT_MS,
    what: "the ledger line",
  });
}

/** A manager whose pool users are bound to callers, as the daemon's are. */
function boundManager(config = ctx.config) {
  const stateDir = mkdtempSync(join(tmpdir(), "wc-ws-run-as-"));
  const { manager } = newManager(config, { poolBindings: new FilePoolBindings(stateDir) });
  return {
    manager,
    async close() {
      await manager.close();
      rmSync(stateDir, { recursive: true, force: true });
    },
  };
}

async function runOf(manager: RunManager, tenant: string, prompt: string) {
  const before = readLedger(ctx.ledger).length;
  const done = await runToEnd(manager, prompt, { provider_id: "pooled", tenant, project_id: "repo" });
  return { ...done, lines: readLedger(ctx.ledger).slice(before) };
}

const name = () => `w-${randomBytes(8).toString("hex")}`;

describe.skipIf(!IS_ROOT)("worktree runs under run_as (needs root to create users and switch to them)", () => {
  beforeAll(() => {
    const users: [TestUser, TestUser] = [createTestUser("w1"), createTestUser("w2")];
    const agent = agentCopy();
    const dir = sharedTestDir("wc-ws-run-as-");
    const ledger = join(dir, "ledger.jsonl");
    writeFileSync(ledger, "");
    chmodSync(ledger, 0o666);
    // The project: the operator's (root's), readable by the pool users, writable by none of them.
    const repo = join(dir, "repo");
    mkdirSync(repo);
    execFileSync("git", ["-C", repo, "init", "-q", "-b", "main"]);
    writeFileSync(join(repo, "README.md"), "demo\n");
    execFileSync("git", ["-C", repo, "add", "-A"]);
    execFileSync("git", ["-C", repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "i"]);
    execFileSync("chmod", ["-R", "a+rX,go-w", repo]);
    // Where the plants put their script (every user may write it, and so may a plant that runs: the canary).
    const plants = join(dir, "plants");
    mkdirSync(plants);
    chmodSync(plants, 0o1777);
    const workspaces = join(dir, "workspaces");
    // The fake agent's sessions (for a follow-up turn), written by whichever pool user runs it.
    const sessions = join(dir, "sessions");
    mkdirSync(sessions);
    chmodSync(sessions, 0o1777);
    const text = [
      "[runner]",
      `state_dir = ${JSON.stringify(join(dir, "state"))}`,
      `workspaces_dir = ${JSON.stringify(workspaces)}`,
      "workspace_keep_secs = 0",
      "[[projects]]",
      'id = "repo"',
      `root = ${JSON.stringify(repo)}`,
      "allow_patch = true",
      'workspace = "worktree"',
      "[acp]",
      "max_concurrent_runs = 4",
      "cancel_grace_secs = 2",
      "[[acp.agents]]",
      'id = "pooled"',
      `executable = ${JSON.stringify(agent.bin)}`,
      `args = ${JSON.stringify(["--ledger", ledger, "--continuation", "both", "--session-dir", sessions])}`,
      'continuation = "both"',
      `run_as = ${JSON.stringify(users.map((u) => u.name))}`,
      "[acp.agents.env_from_env]",
      'PATH = "PATH"',
    ].join("\n");
    const configFile = join(dir, "runner.toml");
    writeFileSync(configFile, `${text}\n`, { mode: 0o600 });
    const unsandboxed = parseConfig(text.replace("[acp]\n", '[acp]\nsandbox = "none"\n'), configFile);
    ctx = { users, agent, dir, ledger, repo, plants, workspaces, config: parseConfig(text, configFile), unsandboxed };
  });

  afterAll(async () => {
    if (!ctx) return;
    expect(await removePoolFixture(ctx)).toEqual([]);
  });

  test(
    "the Runner records a pool user's workspace without running anything planted in its config, common dir, hooks or attributes",
    async () => {
      const [alice] = ctx.users;
      const runId = newRunId();
      const branch = runBranch(runId);
      const dir = join(ctx.workspaces, runId);
      const base = git("rev-parse", "HEAD");
      await addWorktree(ctx.repo, dir, branch, base, { uid: alice.uid, gid: alice.gid });
      expect([statSync(dir).uid, statSync(dir).mode & 0o777]).toEqual([alice.uid, 0o700]);
      // What a run could leave there (written here as root, then handed to the pool user as a run would have it).
      const canary = join(ctx.plants, `canary-${randomBytes(32).toString("hex")}`);
      const script = join(ctx.plants, `plant-${randomBytes(8).toString("hex")}.sh`);
      writeFileSync(script, `#!/bin/sh\nid -u >> ${canary}\ncat\n`, { mode: 0o777 });
      const planted = [
        "[core]",
        `\tfsmonitor = ${script}`,
        `\thooksPath = ${join(dir, ".git", "hooks")}`,
        '[filter "planted"]',
        `\tclean = ${script}`,
        `\tsmudge = ${script}`,
        '[diff "planted"]',
        `\ttextconv = ${script}`,
        "",
      ].join("\n");
      writeFileSync(join(dir, ".git", "config"), readFileSync(join(dir, ".git", "config"), "utf8") + planted);
      mkdirSync(join(dir, ".git", "hooks"), { recursive: true });
      for (const hook of ["pre-commit", "post-commit", "post-index-change", "reference-transaction"]) {
        writeFileSync(join(dir, ".git", "hooks", hook), `#!/bin/sh\nexec ${script}\n`, { mode: 0o777 });
      }
      const common = join(dir, "common");
      mkdirSync(common);
      writeFileSync(join(common, "config"), planted);
      for (const part of ["objects", "refs"]) symlinkSync(join(dir, ".git", part), join(common, part));
      writeFileSync(join(dir, ".git", "commondir"), `${common}\n`);
      writeFileSync(join(dir, ".gitattributes"), "* filter=planted diff=planted\n");
      writeFileSync(join(dir, "left.txt"), "left\n");
      execFileSync("chown", ["-R", "-h", `${alice.uid}:${alice.gid}`, dir]);

      const head = await recordChange(ctx.repo, dir, runId, branch, base, { name: "R", email: "r@example.invalid" });
      expect(existsSync(canary)).toBe(false);
      expect(git("rev-parse", branch)).toBe(head);
      expect(git("rev-parse", `${head}~1`)).toBe(base);
      // The files as they are (no clean filter ran), the planted files among them: the run's content.
      expect(git("show", `${head}:left.txt`)).toBe("left");
      expect(git("show", `${head}:.gitattributes`)).toBe("* filter=planted diff=planted");
      expect(git("show", `${head}:common/config`)).toContain("fsmonitor");
      expect(git("log", "-1", "--format=%an|%s", head)).toBe(`R|webcodex: uncommitted changes of run ${runId}`);
      expect(existsSync(canary)).toBe(false);
      rmSync(dir, { recursive: true, force: true });
    },
    TEST_TIMEOUT_MS,
  );

  test(
    "start-up records a pool user's workspace a previous process left unrecorded, and removes what a killed Runner was making",
    async () => {
      const [alice] = ctx.users;
      const stateDir = mkdtempSync(join(tmpdir(), "wc-ws-run-as-store-"));
      const first = openDispatchStore({ stateDir }).store;
      const runId = newRunId();
      const branch = runBranch(runId);
      const base = git("rev-parse", "HEAD");
      first.admit({
        run_id: runId,
        intent_fingerprint: "f".repeat(64),
        project_id: "repo",
        provider_id: "pooled",
        provider_instance_id: "pi_aaaaaaaaaaaaaaaaaaaa",
        agent_instance_id: "ai_aaaaaaaaaaaaaaaaaaaa",
        created_at: new Date().toISOString(),
      });
      first.recordWorkspace(runId, { branch, base_commit: base });
      const dir = join(ctx.workspaces, runId);
      await addWorktree(ctx.repo, dir, branch, base, { uid: alice.uid, gid: alice.gid });
      writeFileSync(join(dir, "left.txt"), "left behind\n");
      execFileSync("chown", ["-h", `${alice.uid}:${alice.gid}`, join(dir, "left.txt")]);
      // A workspace being made and a scratch repository, as a killed Runner leaves them.
      for (const leftover of [".making-abc123", ".record-def456"])
        mkdirSync(join(ctx.workspaces, leftover, "x"), { recursive: true });
      first.close();

      const store = openDispatchStore({ stateDir }).store;
      const { manager } = newManager(ctx.config, { store });
      try {
        expect(await manager.recoverWorkspaces()).toEqual({ recorded: 1, removed: 0, pending: 0 });
        const head = store.workspace(runId)?.head_commit ?? "";
        expect(git("rev-parse", branch)).toBe(head);
        expect(git("show", `${head}:left.txt`)).toBe("left behind");
        expect(git("rev-parse", `${head}~1`)).toBe(base);
        expect(existsSync(dir)).toBe(false);
        for (const leftover of [".making-abc123", ".record-def456"]) {
          expect(existsSync(join(ctx.workspaces, leftover))).toBe(false);
        }
      } finally {
        await manager.close();
        rmSync(stateDir, { recursive: true, force: true });
      }
    },
    TEST_TIMEOUT_MS,
  );

  test(
    "a run works in a repository its pool user owns: git status, add and commit; its commits are its recorded change",
    async () => {
      const { manager, close } = boundManager();
      try {
        const work = name();
        const done = await runOf(manager, ALICE, `scenario: git_work name=${work}`);
        expect(done.run.state).toBe("completed");
        const worked = done.lines.find((l) => l.event === "git_worked");
        expect(ctx.users.map((u) => u.uid)).toContain(worked?.uid);
        expect(worked?.status).toEqual({ status: 0, add: 0, commit: 0, status_after: 0 });
        const head = done.run.workspace?.head_commit ?? "";
        const branch = runBranch(done.run.run_id);
        expect(done.run.workspace?.branch).toBe(branch);
        // The agent's own commit is the change (nothing was left over), on the run's branch of the project.
        expect(git("rev-parse", branch)).toBe(head);
        expect(git("log", "-1", "--format=%s|%an", head)).toBe(`${work}|fake`);
        expect(git("show", `${head}:${work}`)).toBe(work);
        const changes = await manager.changes(done.run.run_id, 0, 64 * 1024);
        expect(changes?.ok && changes.changes.files.map((f) => `${f.status} ${f.path}`)).toEqual([`added ${work}`]);
        // The project's own tree and branches are as they were; the workspace is gone (no keep time).
        expect(git("status", "--porcelain")).toBe("");
        expect(existsSync(join(ctx.workspaces, done.run.run_id))).toBe(false);
      } finally {
        await close();
      }
    },
    TEST_TIMEOUT_MS,
  );

  test(
    "a follow-up turn gets the workspace made again for its pool user at its parent's head, on the parent's branch",
    async () => {
      const { manager, close } = boundManager();
      try {
        const one = await runOf(manager, ALICE, "scenario: edit_file path=a.txt text=one");
        expect(one.run.state).toBe("completed");
        const branch = runBranch(one.run.run_id);
        const head1 = one.run.workspace?.head_commit ?? "";
        const child = startRequest(manager, "scenario: edit_file path=b.txt text=two hold=true", {
          provider_id: "pooled",
          tenant: ALICE,
          project_id: "repo",
          continue_run_id: one.run.run_id,
        });
        const before = readLedger(ctx.ledger).length;
        expect((await manager.start(child)).ok).toBe(true);
        await ledgerLine(before, (l) => l.event === "file_edited");
        // The conversation's directory, a pool user's again, while the child works there.
        const dir = join(ctx.workspaces, one.run.run_id);
        expect(ctx.users.map((u) => u.uid)).toContain(statSync(dir).uid);
        expect(statSync(dir).mode & 0o777).toBe(0o700);
        await manager.cancel(child.run_id);
        await manager.whenSettled(child.run_id);
        const ended = manager.sync(child.run_id, 0, 0)?.run;
        expect(ended?.workspace).toMatchObject({ branch, base_commit: head1 });
        const head2 = ended?.workspace?.head_commit ?? "";
        expect(git("rev-parse", branch)).toBe(head2);
        expect(git("rev-parse", `${head2}~1`)).toBe(head1);
        expect(git("show", `${head2}:a.txt`)).toBe("one");
        expect(git("show", `${head2}:b.txt`)).toBe("two");
        expect(existsSync(dir)).toBe(false);
      } finally {
        await close();
      }
    },
    TEST_TIMEOUT_MS,
  );

  test.each([
    ["namespaces", () => ctx.config],
    ["none", () => ctx.unsandboxed],
  ] as const)(
    "sandbox = %s: one caller's git plants run neither in another caller's concurrent and later runs nor as the Runner recording, reading or applying its change",
    async (sandbox, config) => {
      const { manager, close } = boundManager(config());
      const canary = join(ctx.plants, `canary-${randomBytes(32).toString("hex")}`);
      try {
        const before = readLedger(ctx.ledger).length;
        const planter = startRequest(manager, `scenario: git_plant_all dir=${ctx.plants} canary=${canary} hold=true`, {
          provider_id: "pooled",
          tenant: ALICE,
          project_id: "repo",
        });
        expect((await manager.start(planter)).ok).toBe(true);
        const planted = await ledgerLine(before, (l) => l.event === "git_planted_all");
        const alice = planted.uid as number;
        const result = planted.result as Record<string, string>;
        // What it could plant, it did: its work tree's attributes, a hooks dir, an include file and a common dir of
        // its own; without the sandbox also its repository's config, hooks and attributes …
        expect(result).toMatchObject({
          attributes_tree: "ok",
          hooks_hooks_path: "ok",
          include_file: "ok",
          commondir: "ok",
        });
        if (sandbox === "none") {
          expect(result).toMatchObject({ config_local: "ok", hooks_own: "ok", attributes_info: "ok" });
        }
        // … and nothing of the project's repository (the operator's, read only to pool users).
        for (const key of ["config_project", "hooks_project", "attributes_project"]) expect(result[key]).not.toBe("ok");
        // Its workspace is its own: its pool user's, 0700, in the Runner's 0711 directory.
        const own = statSync(join(ctx.workspaces, planter.run_id));
        expect([own.uid, own.mode & 0o777]).toEqual([alice, 0o700]);
        expect(statSync(ctx.workspaces).mode & 0o777).toBe(0o711);

        // Another caller's run while the planter lives: git status, add, commit — as its own pool user.
        const concurrent = await runOf(manager, BOB, `scenario: git_work name=${name()}`);
        expect(concurrent.run.state).toBe("completed");
        const bobLine = concurrent.lines.find((l) => l.event === "git_worked");
        expect(bobLine?.uid).not.toBe(alice);
        expect(bobLine?.status).toEqual({ status: 0, add: 0, commit: 0, status_after: 0 });

        // The planter ends: the Runner records what it left (its attributes and files), running none of it.
        await manager.cancel(planter.run_id);
        await manager.whenSettled(planter.run_id);
        const ended = manager.sync(planter.run_id, 0, 0)?.run;
        expect(ended?.state).toBe("cancelled");
        const head = ended?.workspace?.head_commit ?? "";
        expect(git("show", `${head}:.gitattributes`)).toContain("* filter=planted diff=planted");
        expect(git("ls-tree", "--name-only", head)).toContain("README.md");
        const changes = await manager.changes(planter.run_id, 0, 64 * 1024);
        expect(changes?.ok && changes.changes.files.map((f) => f.path)).toContain(".gitattributes");

        // Another caller's later run, then the planter's change applied into the project's checked-out branch.
        const later = await runOf(manager, BOB, `scenario: git_work name=${name()}`);
        expect(later.lines.find((l) => l.event === "git_worked")?.status).toEqual({
          status: 0,
          add: 0,
          commit: 0,
          status_after: 0,
        });
        const applied = await manager.apply(planter.run_id, "main", (sandbox === "none" ? "b" : "a").repeat(64));
        expect(applied?.ok && applied.apply.result).toBe("fast_forward");
        expect(git("rev-parse", "main")).toBe(head);
        expect(git("status", "--porcelain")).toBe("");

        // Every run and git command above has ended: no plant ever ran.
        expect(existsSync(canary)).toBe(false);
      } finally {
        rmSync(canary, { force: true });
        await close();
      }
    },
    TEST_TIMEOUT_MS,
  );
});
