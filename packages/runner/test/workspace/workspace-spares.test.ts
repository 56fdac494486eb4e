/**
 * Spare worktrees (design §16, workspace/spares.ts), over real git repositories, the real run manager and the
 * fake agent: a `worktree` project's run whose base is HEAD takes a checkout made ahead of it (moved to the run's
 * directory, its branch made there: no file written on the start path), its tree that of a fresh checkout of its
 * base; a spare of an older HEAD is never taken and is replaced; two concurrent starts get two worktrees; the
 * spares go at shutdown, and whatever a previous process left of them goes at start-up.
 */
import {
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { join, relative } from "node:path";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { poll, readLedger } from "../../../../scripts/test-support/index.js";
import { ConfigError, parseConfig, type RunnerConfig } from "../../src/config/config.js";
import type { RunManager } from "../../src/runs/manager.js";
import { SPARES_DIR_NAME } from "../../src/workspace/spares.js";
import { runBranch } from "../../src/workspace/worktree.js";
import { makeWorkspace, newManager, runToEnd, startRequest, type Workspace } from "../support/harness.js";
import { git, worktreeConfig } from "../support/worktree-project.js";

const WAIT = { timeoutMs: 60_000, intervalMs: 50 };

/** A project repository of a few hundred files in nested directories, an executable and a symlink; one commit. */
function initRepo(ws: Workspace): string {
  git(ws.projectRoot, "init", "-q", "-b", "main");
  for (let d = 0; d < 4; d++) {
    mkdirSync(join(ws.projectRoot, `dir${d}`, "sub"), { recursive: true });
    for (let f = 0; f < 50; f++) writeFileSync(join(ws.projectRoot, `dir${d}`, "sub", `f${f}.txt`), `${d} ${f}\n`);
  }
  writeFileSync(join(ws.projectRoot, "README.md"), "demo\n");
  writeFileSync(join(ws.projectRoot, "run.sh"), "#!/bin/sh\necho hi\n", { mode: 0o755 });
  symlinkSync("README.md", join(ws.projectRoot, "link.md"));
  writeFileSync(join(ws.projectRoot, ".gitignore"), "ignored.log\n");
  git(ws.projectRoot, "add", "-A");
  git(ws.projectRoot, "commit", "-q", "-m", "initial");
  return git(ws.projectRoot, "rev-parse", "HEAD");
}

function load(ws: Workspace, runner = ""): RunnerConfig {
  const { text, file } = worktreeConfig(ws, {
    runner: [runner],
    acp: ["max_concurrent_runs = 4", "cancel_grace_secs = 5"],
  });
  return parseConfig(text, file);
}

type LogLine = { msg: string; [key: string]: unknown };

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

/** A manager on `ws` (its log captured) whose start-up recovery ran: its spares are being made. */
async function started(ws: Workspace, runner = "") {
  const lines: LogLine[] = [];
  const logger = pino({ level: "info" }, { write: (line: string) => lines.push(JSON.parse(line) as LogLine) });
  const dir = join(ws.dir, "worktrees");
  const { manager, store } = newManager(load(ws, runner), { workspacesDir: dir, logger });
  managers.push(manager);
  await manager.recoverWorkspaces();
  return { manager, store, lines, dir, spares: join(dir, SPARES_DIR_NAME) };
}

/** Waits until `n` spares at `commit` were made in all. */
async function sparesMade(lines: readonly LogLine[], commit: string, n: number): Promise<void> {
  await poll(() => lines.filter((l) => l.msg === "spare worktree made" && l.commit === commit).length >= n, {
    ...WAIT,
    what: `${n} spare worktree(s) at ${commit}`,
  });
}

/** The "worktree made" log line of a run. */
function madeLine(lines: readonly LogLine[], runId: string): LogLine | undefined {
  return lines.find((l) => l.msg === "worktree made" && l.run_id === runId);
}

/** The name of the admin dir git keeps for the worktree at `dir` (`.git/worktrees/<name>`). */
function adminName(dir: string): string {
  const pointer = readFileSync(join(dir, ".git"), "utf8").trim();
  return pointer.slice(pointer.lastIndexOf("/") + 1);
}

/** Every entry under `dir` but `.git`: path, kind, executable bit, content or link target. */
function tree(dir: string): string[] {
  const out: string[] = [];
  const walk = (at: string): void => {
    for (const name of readdirSync(at).sort()) {
      if (at === dir && name === ".git") continue;
      const path = join(at, name);
      const st = lstatSync(path);
      const rel = relative(dir, path);
      if (st.isSymbolicLink()) out.push(`${rel} link ${readlinkSync(path)}`);
      else if (st.isDirectory()) walk(path);
      else out.push(`${rel} file ${(st.mode & 0o111) !== 0 ? "x" : "-"} ${readFileSync(path, "base64")}`);
    }
  };
  walk(dir);
  return out;
}

/**
 * The tree of a fresh checkout of `commit` of the project, made by the test's own git in a clone (then removed).
 * Not a `git worktree add` in the project: git's worktree commands read every worktree's admin dir, and one the
 * Runner is making a spare in at that moment is half written ("failed to read …/commondir").
 */
function freshTree(ws: Workspace, commit: string): string[] {
  const dir = join(ws.dir, `fresh-${commit.slice(0, 12)}`);
  git(ws.dir, "clone", "-q", "--no-checkout", "--shared", ws.projectRoot, dir);
  try {
    git(dir, "checkout", "-q", "--detach", commit);
    return tree(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The worktrees git records for the project, but its own tree. */
function linkedWorktrees(ws: Workspace): string[] {
  return git(ws.projectRoot, "worktree", "list", "--porcelain")
    .split("\n")
    .filter((line) => line.startsWith("worktree "))
    .slice(1)
    .map((line) => line.slice("worktree ".length));
}

function listSpares(spares: string): string[] {
  return existsSync(spares) ? readdirSync(spares) : [];
}

describe("spare worktrees", () => {
  it("a start takes a whole spare at its base: no file written on its start path, its tree a fresh checkout's, and a new spare follows", async () => {
    const ws = fresh();
    const base = initRepo(ws);
    const { manager, lines, dir, spares } = await started(ws);
    await sparesMade(lines, base, 1);
    const [spare] = listSpares(spares);
    expect(listSpares(spares)).toHaveLength(1);
    const spareDir = join(spares, spare ?? "");
    const spareAdmin = adminName(spareDir);
    const inodes = ["README.md", "dir3/sub/f49.txt", "run.sh"].map((p) => statSync(join(spareDir, p)).ino);

    const { run } = await runToEnd(manager, "scenario: hello");
    expect(run.state).toBe("completed");
    expect(run.workspace).toMatchObject({ base_commit: base, branch: runBranch(run.run_id), head_commit: base });
    const worktree = join(dir, run.run_id);
    expect(madeLine(lines, run.run_id)).toMatchObject({ from_spare: true, base_commit: base });
    // The spare itself, moved: git's record of it and the very files the spare's checkout wrote.
    expect(existsSync(spareDir)).toBe(false);
    expect(adminName(worktree)).toBe(spareAdmin);
    expect(["README.md", "dir3/sub/f49.txt", "run.sh"].map((p) => statSync(join(worktree, p)).ino)).toEqual(inodes);
    // On the run's branch, clean, and file for file a fresh checkout of the base.
    expect(git(worktree, "symbolic-ref", "HEAD")).toBe(`refs/heads/${runBranch(run.run_id)}`);
    expect(git(worktree, "status", "--porcelain", "--ignored")).toBe("");
    expect(tree(worktree)).toEqual(freshTree(ws, base));

    // A new spare is made in the background, at HEAD; the one taken is not counted twice.
    await sparesMade(lines, base, 2);
    expect(listSpares(spares)).toHaveLength(1);
    expect(listSpares(spares)).not.toContain(spare);

    // The next start takes that one, and an edit in it is recorded like any run's.
    const second = await runToEnd(manager, "scenario: edit_file path=dir0/sub/f0.txt text=changed");
    expect(madeLine(lines, second.run.run_id)).toMatchObject({ from_spare: true });
    const head = second.run.workspace?.head_commit ?? "";
    expect(git(ws.projectRoot, "show", `${head}:dir0/sub/f0.txt`)).toBe("changed");
    expect(git(ws.projectRoot, "rev-parse", `${head}~1`)).toBe(base);
    expect(readFileSync(join(ws.projectRoot, "dir0", "sub", "f0.txt"), "utf8")).toBe("0 0\n");
  });

  it("a start while the spare at its base is still being checked out takes that spare once whole, not a checkout of its own", async () => {
    const ws = fresh();
    initRepo(ws);
    // A smudge filter holds the spare's checkout at gated.txt until the test opens the gate.
    const gate = join(ws.dir, "gate");
    const smudging = join(ws.dir, "smudging");
    writeFileSync(join(ws.projectRoot, ".gitattributes"), "gated.txt filter=gate\n");
    writeFileSync(join(ws.projectRoot, "gated.txt"), "behind the gate\n");
    git(ws.projectRoot, "add", "-A");
    git(ws.projectRoot, "commit", "-q", "-m", "gated");
    const base = git(ws.projectRoot, "rev-parse", "HEAD");
    git(
      ws.projectRoot,
      "config",
      "filter.gate.smudge",
      `sh -c ': > ${smudging}; i=0; while [ ! -e ${gate} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; cat'`,
    );
    const { manager, store, lines, dir, spares } = await started(ws);
    await poll(() => existsSync(smudging), { ...WAIT, what: "the spare's checkout at the gate" });
    const [spare] = listSpares(spares);
    expect(listSpares(spares)).toHaveLength(1);
    const spareAdmin = adminName(join(spares, spare ?? ""));

    const req = startRequest(manager, "scenario: hello");
    expect((await manager.start(req)).ok).toBe(true);
    // Its base recorded: the run has claimed its spare (in the same step) and waits for it.
    await poll(() => store.workspace(req.run_id) !== undefined, { ...WAIT, what: "the run's base recorded" });
    expect(lines.some((l) => l.msg === "spare worktree made")).toBe(false);
    writeFileSync(gate, "");
    await manager.whenSettled(req.run_id);

    expect(madeLine(lines, req.run_id)).toMatchObject({ from_spare: true, waited_for_spare: true });
    const worktree = join(dir, req.run_id);
    expect(adminName(worktree)).toBe(spareAdmin);
    expect(readFileSync(join(worktree, "gated.txt"), "utf8")).toBe("behind the gate\n");
    expect(tree(worktree)).toEqual(freshTree(ws, base));
  });

  it("never gives a run a spare of an older HEAD: the run checks out its own base, and the spare is replaced", async () => {
    const ws = fresh();
    const first = initRepo(ws);
    const { manager, lines, spares } = await started(ws);
    await sparesMade(lines, first, 1);
    const [stale] = listSpares(spares);

    // The project moves on: a file changed, one added, one removed.
    writeFileSync(join(ws.projectRoot, "README.md"), "demo, later\n");
    writeFileSync(join(ws.projectRoot, "dir1", "new.txt"), "new\n");
    rmSync(join(ws.projectRoot, "dir2", "sub", "f7.txt"));
    git(ws.projectRoot, "add", "-A");
    git(ws.projectRoot, "commit", "-q", "-m", "later");
    const second = git(ws.projectRoot, "rev-parse", "HEAD");

    const { run } = await runToEnd(manager, "scenario: hello");
    expect(run.workspace?.base_commit).toBe(second);
    expect(madeLine(lines, run.run_id)).toMatchObject({ from_spare: false });
    const worktree = join(ws.dir, "worktrees", run.run_id);
    expect(adminName(worktree)).not.toBe(stale);
    expect(tree(worktree)).toEqual(freshTree(ws, second));

    // The stale spare goes; one at the new HEAD takes its place.
    await sparesMade(lines, second, 1);
    expect(lines.some((l) => l.msg === "a spare worktree of an older HEAD removed")).toBe(true);
    expect(listSpares(spares)).toHaveLength(1);
    expect(listSpares(spares)).not.toContain(stale);
    expect(linkedWorktrees(ws).filter((p) => p.includes(stale ?? "-"))).toEqual([]);
    // And a run from the old commit by name still gets exactly that commit's tree.
    const old = await runToEnd(manager, "scenario: hello", { base_ref: first });
    expect(tree(join(ws.dir, "worktrees", old.run.run_id))).toEqual(freshTree(ws, first));
  });

  it("two concurrent starts get two distinct worktrees, each from its own spare, each change its own", async () => {
    const ws = fresh();
    const base = initRepo(ws);
    const { manager, lines, dir } = await started(ws, "worktree_spares = 2");
    await sparesMade(lines, base, 2);
    const a = startRequest(manager, "scenario: edit_file path=README.md text=from-a hold=true");
    const b = startRequest(manager, "scenario: edit_file path=README.md text=from-b hold=true");
    const [sa, sb] = await Promise.all([manager.start(a), manager.start(b)]);
    expect(sa.ok && sb.ok).toBe(true);
    await poll(() => readLedger(ws.ledger).filter((l) => l.event === "file_edited").length === 2, {
      ...WAIT,
      what: "both edits",
    });
    expect(madeLine(lines, a.run_id)).toMatchObject({ from_spare: true });
    expect(madeLine(lines, b.run_id)).toMatchObject({ from_spare: true });
    const [da, db] = [join(dir, a.run_id), join(dir, b.run_id)];
    expect(adminName(da)).not.toBe(adminName(db));
    expect(readFileSync(join(da, "README.md"), "utf8")).toBe("from-a\n");
    expect(readFileSync(join(db, "README.md"), "utf8")).toBe("from-b\n");
    await manager.cancel(a.run_id);
    await manager.cancel(b.run_id);
    await Promise.all([manager.whenSettled(a.run_id), manager.whenSettled(b.run_id)]);
    for (const [req, text] of [
      [a, "from-a"],
      [b, "from-b"],
    ] as const) {
      const head = manager.sync(req.run_id, 0, 0)?.run.workspace?.head_commit ?? "";
      expect(git(ws.projectRoot, "show", `${head}:README.md`)).toBe(text);
      expect(git(ws.projectRoot, "rev-parse", `${head}~1`)).toBe(base);
    }
  });

  it("removes its spares at shutdown, one still being made too", async () => {
    const ws = fresh();
    const base = initRepo(ws);
    const admins = join(ws.projectRoot, ".git", "worktrees");
    const { manager, lines, spares } = await started(ws, "worktree_spares = 2");
    await sparesMade(lines, base, 2);
    expect(linkedWorktrees(ws)).toHaveLength(2);
    await manager.close();
    expect(listSpares(spares)).toEqual([]);
    expect(linkedWorktrees(ws)).toEqual([]);
    expect(existsSync(admins) ? readdirSync(admins) : []).toEqual([]);

    // Closed right after start-up: the first spare is still being made (or not yet begun), and goes all the same.
    const again = await started(ws, "worktree_spares = 2");
    await again.manager.close();
    expect(listSpares(spares)).toEqual([]);
    expect(linkedWorktrees(ws)).toEqual([]);
    expect(existsSync(admins) ? readdirSync(admins) : []).toEqual([]);
  });

  it("removes at start-up the spares a previous process left, a half-made one too, then makes its own", async () => {
    const ws = fresh();
    const base = initRepo(ws);
    const spares = join(ws.dir, "worktrees", SPARES_DIR_NAME);
    mkdirSync(spares, { recursive: true });
    // Whole; half made (its `worktree add` killed: still locked "initializing", no `.git` yet); not git's at all.
    git(ws.projectRoot, "worktree", "add", "-q", "--detach", join(spares, "spare-whole"), base);
    git(ws.projectRoot, "worktree", "add", "-q", "--no-checkout", "--detach", join(spares, "spare-half"), base);
    writeFileSync(join(ws.projectRoot, ".git", "worktrees", "spare-half", "locked"), "initializing");
    rmSync(join(spares, "spare-half", ".git"));
    mkdirSync(join(spares, "spare-stray"));
    expect(linkedWorktrees(ws)).toHaveLength(2);

    const { lines } = await started(ws);
    const recovered = lines.find((l) => l.msg === "workspaces recovered");
    expect(recovered).toMatchObject({ spares_removed: 2 });
    await sparesMade(lines, base, 1);
    const left = listSpares(spares);
    expect(left).toHaveLength(1);
    expect(left).not.toEqual(expect.arrayContaining(["spare-whole", "spare-half", "spare-stray"]));
    expect(readdirSync(join(ws.projectRoot, ".git", "worktrees"))).toEqual(left);
    expect(linkedWorktrees(ws)).toHaveLength(1);
  });

  it("makes no spare with worktree_spares = 0, and refuses a count out of bounds precisely", async () => {
    const ws = fresh();
    initRepo(ws);
    expect(load(ws).runner.worktreeSpares).toBe(1);
    const { manager, lines, spares } = await started(ws, "worktree_spares = 0");
    const { run } = await runToEnd(manager, "scenario: hello");
    expect(madeLine(lines, run.run_id)).toMatchObject({ from_spare: false });
    expect(existsSync(spares)).toBe(false);

    for (const [value, says] of [
      ["9", "runner.worktree_spares: must be at most 8"],
      ["-1", "runner.worktree_spares: must be at least 0"],
      ["1.5", "runner.worktree_spares: must be an integer"],
      ['"2"', "runner.worktree_spares: must be an integer"],
    ] as const) {
      let errors: readonly string[] = [];
      try {
        load(ws, `worktree_spares = ${value}`);
      } catch (error) {
        if (!(error instanceof ConfigError)) throw error;
        errors = error.errors;
      }
      expect(errors.join("\n")).toContain(says);
    }
  });
});
