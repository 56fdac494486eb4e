/**
 * Issue 41 §3 (the first piece): a Runner killed with SIGKILL while a worktree run's agent is editing loses no
 * change. The restarted daemon, before its hello, ends the run as recovery says (lost), reaps the agent,
 * records what the worktree held on the run's branch and removes the worktree; `run.changes` answers it.
 * A git killed mid-write with it leaves its `.lock` files: a stale one is removed and the change recorded; a
 * young or held one is left and the recording tried again later (workspace/locks.ts). The run took the spare
 * worktree made ahead of it (workspace/spares.ts), and a new spare was there at the kill: the restarted Runner
 * removes it and makes its own.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { closeSync, existsSync, openSync, readdirSync, readFileSync, utimesSync, writeFileSync } from "node:fs";
import { isAbsolute, join, resolve } from "node:path";
import type { RunChangesFrame, RunnerFrame } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import { killProcesses, poll, processesMentioning, readLedger } from "../../../../scripts/test-support/index.js";
import {
  git,
  killAllRunners,
  makeSandbox,
  type RunnerConnection,
  runStartFrame,
  type Sandbox,
  startRunner,
  startTestServer,
  type TestServer,
} from "../support/crash-matrix-harness.js";
import { newRunId } from "../support/harness.js";

const answers =
  (requestId: string) =>
  (f: RunnerFrame): f is RunnerFrame =>
    "request_id" in f && f.request_id === requestId;

/** The admin dir git keeps for the worktree at `worktree` (`<project>/.git/worktrees/<name>`). */
function adminDirOf(worktree: string): string {
  const named = readFileSync(join(worktree, ".git"), "utf8")
    .trim()
    .replace(/^gitdir: /, "");
  return isAbsolute(named) ? named : resolve(worktree, named);
}

/** A lock file as a git killed mid-write leaves it: part of what it was writing, last written `ageMs` ago. */
function plantLock(path: string, ageMs: number): void {
  writeFileSync(path, "DIRC\0\0\0\x02");
  const when = (Date.now() - ageMs) / 1000;
  utimesSync(path, when, when);
}

/** Bound on a Runner daemon's link coming up after its start (sized for a loaded machine). */
const CONNECT_WAIT_MS = 60_000;

/** Older than the git command bound plus its margin (locks.ts STALE_GIT_LOCK_MS = 90 s). */
const STALE_AGE_MS = 10 * 60_000;

const SPARE_MADE = "spare worktree made";

/** The spare worktrees in the Runner's spares dir now (workspace/spares.ts). */
function spareNames(sandbox: Sandbox): string[] {
  const dir = join(sandbox.stateDir, "workspaces", ".spares");
  return existsSync(dir) ? readdirSync(dir) : [];
}

/**
 * A worktree run whose agent wrote notes/edit.txt and holds, its Runner then SIGKILLed (its agent left running,
 * as a kill of the Runner's pid alone leaves it; the next start reaps it). The run took the spare made ahead of
 * it, and the next spare was made before the kill: `spares` names it.
 */
async function killedMidEdit(
  server: TestServer,
  sandbox: Sandbox,
  runId: string,
): Promise<{ worktree: string; first: ReturnType<typeof startRunner>; spares: string[] }> {
  const first = startRunner(sandbox);
  const conn = await server.nextConnection(CONNECT_WAIT_MS);
  await poll(() => count(first.output(), SPARE_MADE) >= 1, { timeoutMs: 60_000, what: "the first spare" });
  const taken = spareNames(sandbox);
  const start = runStartFrame(
    conn,
    "fake",
    runId,
    "scenario: edit_file path=notes/edit.txt text=before-the-crash hold=true",
  );
  conn.send(start);
  expect(await conn.next(answers(start.request_id))).toMatchObject({ type: "run.start.result" });
  await poll(() => readLedger(sandbox.ledger).some((l) => l.event === "file_edited"), {
    timeoutMs: 60_000,
    what: "the agent's edit",
  });
  const worktree = join(sandbox.stateDir, "workspaces", runId);
  expect(readFileSync(join(worktree, "notes", "edit.txt"), "utf8")).toBe("before-the-crash\n");
  // The run works in the spare (git's admin dir of its worktree is the spare's), and the next one is made.
  expect(taken).toHaveLength(1);
  expect(adminDirOf(worktree).endsWith(`/worktrees/${taken[0]}`)).toBe(true);
  await poll(() => count(first.output(), SPARE_MADE) >= 2, { timeoutMs: 60_000, what: "the next spare" });
  const spares = spareNames(sandbox);
  expect(spares).toHaveLength(1);
  await first.signal("SIGKILL");
  return { worktree, first, spares };
}

/** The run's change as `run.changes` answers it now. */
async function changesOf(conn: RunnerConnection, runId: string, n: number): Promise<RunnerFrame> {
  const ask: RunChangesFrame = { type: "run.changes", request_id: `changes-${n}`, run_id: runId, max_bytes: 4096 };
  conn.send(ask);
  return conn.next(answers(ask.request_id));
}

/** Occurrences of `text` in `output`. */
function count(output: string, text: string): number {
  return output.split(text).length - 1;
}

const WAITS = "recording the run's change waits for git locks that may still be held";

/** A test Server and a worktree sandbox, cleaned up after the test. */
async function setUp(): Promise<{ server: TestServer; sandbox: Sandbox; project: string }> {
  const server = await startTestServer();
  servers.push(server);
  const sandbox = makeSandbox({ serverUrl: server.url, workspace: "worktree" });
  sandboxes.push(sandbox);
  return { server, sandbox, project: join(sandbox.dir, "project") };
}

/** The head the restarted Runner's hello reports for the run, which recovery ended lost with its change recorded. */
function recoveredHead(conn: RunnerConnection, runId: string): string {
  const run = conn.hello.inventory.find((r) => r.run_id === runId);
  expect(run).toMatchObject({ state: "lost", workspace: { mode: "worktree", branch: `webcodex/run/${runId}` } });
  const head = run?.workspace?.head_commit ?? "";
  expect(head).toMatch(/^[0-9a-f]{40}$/);
  return head;
}

/**
 * No worktree of the run left: not on disk, not in the Runner's workspaces dir, not in git's list; nor the spare
 * the killed Runner left (`spares`): the only worktrees besides the project's own are the restarted Runner's one
 * spare, at most.
 */
function expectWorktreeGone(
  sandbox: Sandbox,
  project: string,
  worktree: string,
  runId: string,
  spares: readonly string[],
): void {
  expect(existsSync(worktree)).toBe(false);
  expect(readdirSync(join(sandbox.stateDir, "workspaces")).filter((name) => name !== ".spares")).toEqual([]);
  const listed = git(project, "worktree", "list", "--porcelain");
  expect(listed).not.toContain(runId);
  for (const spare of spares) expect(listed).not.toContain(spare);
  expect(spareNames(sandbox).filter((name) => spares.includes(name))).toEqual([]);
  const linked = listed
    .split("\n")
    .filter((line) => line.startsWith("worktree "))
    .slice(1);
  expect(linked.length).toBeLessThanOrEqual(1);
  for (const line of linked) expect(line).toContain("/.spares/spare-");
}

/** Asks `run.changes` until the change is recorded (a retry of the Runner's); then the worktree goes. */
async function untilRecorded(conn: RunnerConnection, runId: string, worktree: string, what: string): Promise<void> {
  let n = 1;
  await poll(
    async () => {
      n += 1;
      const answer = await changesOf(conn, runId, n);
      return "changes" in answer && answer.changes.recorded;
    },
    { timeoutMs: 90_000, intervalMs: 1_000, what },
  );
  await poll(() => !existsSync(worktree), { timeoutMs: 30_000, what: "the worktree removed" });
}

const holders: ChildProcess[] = [];
const servers: TestServer[] = [];
const sandboxes: Sandbox[] = [];
afterEach(async () => {
  for (const h of holders.splice(0)) h.kill("SIGKILL");
  await killAllRunners();
  for (const s of sandboxes.splice(0)) {
    killProcesses(processesMentioning(s.ledger));
    s.cleanup();
  }
  for (const s of servers.splice(0)) await s.close();
});

describe("workspaces across a Runner crash", { timeout: 240_000 }, () => {
  it("records the change of a run whose Runner was killed mid-edit, at the next start, before the hello", async () => {
    const { server, sandbox, project } = await setUp();
    const runId = newRunId();
    const { worktree, first, spares } = await killedMidEdit(server, sandbox, runId);

    const second = startRunner(sandbox);
    const conn2 = await server.nextConnection(CONNECT_WAIT_MS);
    // Before the hello: the agent reaped, the change recorded, the worktree and the killed Runner's spare gone.
    expect(processesMentioning(sandbox.ledger)).toEqual([]);
    const head = recoveredHead(conn2, runId);
    expect(git(project, "show", `${head}:notes/edit.txt`)).toBe("before-the-crash");
    expect(git(project, "log", "-1", "--format=%B", head)).toContain(runId);
    expectWorktreeGone(sandbox, project, worktree, runId, spares);
    expect(second.output()).toContain("workspaces recovered");
    expect(second.output()).toContain('"spares_removed":1');
    // Then the restarted Runner makes its own spare, at HEAD.
    await poll(() => count(second.output(), SPARE_MADE) >= 1, { timeoutMs: 60_000, what: "the new spare" });
    expectWorktreeGone(sandbox, project, worktree, runId, spares);
    expect(spareNames(sandbox)).toHaveLength(1);

    expect(await changesOf(conn2, runId, 1)).toMatchObject({
      type: "run.changes.result",
      changes: {
        recorded: true,
        head_commit: head,
        files: [{ path: "notes/edit.txt", status: "added", insertions: 1, deletions: 0, binary: false }],
      },
    });
    // The diff is project content: the Runner's log never carries it.
    expect(second.output()).not.toContain("before-the-crash");
    expect(first.output()).not.toContain("before-the-crash");
  });
  it("removes a stale index.lock a git killed with the Runner left, then records the change and the worktree goes", async () => {
    const { server, sandbox, project } = await setUp();
    const runId = newRunId();
    const { worktree, spares } = await killedMidEdit(server, sandbox, runId);
    // As a `git add` or `git commit` of the Runner's, killed with it, leaves its locks: the worktree's index and
    // the run's branch.
    const admin = adminDirOf(worktree);
    const indexLock = join(admin, "index.lock");
    const refLock = join(project, ".git", "refs", "heads", "webcodex", "run", `${runId}.lock`);
    plantLock(indexLock, STALE_AGE_MS);
    plantLock(refLock, STALE_AGE_MS);

    const second = startRunner(sandbox);
    const conn = await server.nextConnection(CONNECT_WAIT_MS);
    const head = recoveredHead(conn, runId);
    expect(git(project, "show", `webcodex/run/${runId}:notes/edit.txt`)).toBe("before-the-crash");
    expect(git(project, "rev-parse", `webcodex/run/${runId}`)).toBe(head);
    expect(existsSync(indexLock)).toBe(false);
    expect(existsSync(refLock)).toBe(false);
    expectWorktreeGone(sandbox, project, worktree, runId, spares);
    expect(second.output()).toContain("stale git locks of a killed git removed");
    // Log lines name the run, never a path or the change.
    expect(second.output()).not.toContain(admin);
    expect(second.output()).not.toContain("before-the-crash");
  });

  it("leaves a lock younger than the git bound in place, then records the change once it turns stale", async () => {
    const { server, sandbox, project } = await setUp();
    const runId = newRunId();
    const { worktree } = await killedMidEdit(server, sandbox, runId);
    // Just written: its git (an orphan of a Runner killed alone) may still be about to finish it.
    const indexLock = join(adminDirOf(worktree), "index.lock");
    plantLock(indexLock, 0);

    const second = startRunner(sandbox);
    const conn = await server.nextConnection(CONNECT_WAIT_MS);
    const run = conn.hello.inventory.find((r) => r.run_id === runId);
    expect(run).toMatchObject({ state: "lost", workspace: { mode: "worktree" } });
    expect(run?.workspace?.head_commit).toBeUndefined();
    expect(existsSync(indexLock)).toBe(true);
    expect(readFileSync(join(worktree, "notes", "edit.txt"), "utf8")).toBe("before-the-crash\n");
    expect(second.output()).toContain(WAITS);
    expect(await changesOf(conn, runId, 1)).toMatchObject({ changes: { recorded: false } });

    // Time passes (as the lock's clock sees it): the next retry finds it stale.
    plantLock(indexLock, STALE_AGE_MS);
    await untilRecorded(conn, runId, worktree, "the change recorded on a retry");
    const head = git(project, "rev-parse", `webcodex/run/${runId}`);
    expect(git(project, "show", `${head}:notes/edit.txt`)).toBe("before-the-crash");
    expect(existsSync(indexLock)).toBe(false);
    expect(second.output()).toContain("unrecorded changes recorded on retry");
  });

  it("leaves an old lock a live process holds open, and records the change once it is let go", async () => {
    const { server, sandbox, project } = await setUp();
    const runId = newRunId();
    const { worktree } = await killedMidEdit(server, sandbox, runId);
    // Old, but open in a live process: a git orphaned by a Runner killed alone, still at work past any bound.
    const indexLock = join(adminDirOf(worktree), "index.lock");
    plantLock(indexLock, STALE_AGE_MS);
    const fd = openSync(indexLock, "a");
    const holder = spawn("sleep", ["600"], { stdio: ["ignore", fd, "ignore"] });
    closeSync(fd);
    holders.push(holder);

    const second = startRunner(sandbox);
    const conn = await server.nextConnection(CONNECT_WAIT_MS);
    const run = conn.hello.inventory.find((r) => r.run_id === runId);
    expect(run?.workspace?.head_commit).toBeUndefined();
    expect(existsSync(indexLock)).toBe(true);
    const waits = count(second.output(), WAITS);
    expect(waits).toBeGreaterThanOrEqual(1);
    // A retry came and went: the lock is still there.
    await poll(() => count(second.output(), WAITS) > waits, { timeoutMs: 90_000, what: "a retry" });
    expect(existsSync(indexLock)).toBe(true);
    expect(await changesOf(conn, runId, 1)).toMatchObject({ changes: { recorded: false } });

    holder.kill("SIGKILL");
    await untilRecorded(conn, runId, worktree, "the change recorded once the lock is let go");
    const head = git(project, "rev-parse", `webcodex/run/${runId}`);
    expect(git(project, "show", `${head}:notes/edit.txt`)).toBe("before-the-crash");
  });
});
