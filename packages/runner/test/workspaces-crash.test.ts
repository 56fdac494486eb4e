/**
 * Issue 41 §3 (the first piece): a Runner killed with SIGKILL while a worktree run's agent is editing loses no
 * change. The restarted daemon, before its hello, ends the run as recovery says (lost), reaps the agent,
 * records what the worktree held on the run's branch and removes the worktree; `run.changes` answers it.
 */
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { RunChangesFrame, RunnerFrame, RunStartFrame } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import { killProcesses, poll, processesMentioning, readLedger } from "../../../scripts/test-support/index.js";
import {
  killAllRunners,
  makeSandbox,
  type RunnerConnection,
  type Sandbox,
  startRunner,
  startTestServer,
  type TestServer,
} from "./crash-matrix-harness.js";

function git(cwd: string, ...args: string[]): string {
  return execFileSync("git", ["-c", "user.name=t", "-c", "user.email=t@example.invalid", ...args], {
    cwd,
    encoding: "utf8",
  }).trim();
}

/** The sandbox's project as a `worktree` project: a git repository with one commit. */
function worktreeSandbox(serverUrl: string): Sandbox {
  const sandbox = makeSandbox({ serverUrl });
  const project = join(sandbox.dir, "project");
  writeFileSync(join(project, "README.md"), "demo\n");
  git(project, "init", "-q", "-b", "main");
  git(project, "add", "-A");
  git(project, "commit", "-q", "-m", "initial");
  const config = readFileSync(sandbox.configPath, "utf8").replace(
    "allow_patch = true\n",
    'allow_patch = true\nworkspace = "worktree"\n',
  );
  writeFileSync(sandbox.configPath, config);
  return sandbox;
}

function runStart(conn: RunnerConnection, runId: string, prompt: string): RunStartFrame {
  const provider = conn.hello.providers.find((p) => p.provider_id === "fake");
  if (!provider) throw new Error("runner did not advertise the fake provider");
  return {
    type: "run.start",
    request_id: `start-${runId}`,
    run_id: runId,
    intent_fingerprint: randomBytes(32).toString("hex"),
    project_id: "demo",
    provider_id: "fake",
    agent_instance_id: conn.hello.agent_instance_id,
    provider_instance_id: provider.provider_instance_id,
    prompt,
    config: {},
    timeout_secs: null,
  };
}

const answers =
  (requestId: string) =>
  (f: RunnerFrame): f is RunnerFrame =>
    "request_id" in f && f.request_id === requestId;

const servers: TestServer[] = [];
const sandboxes: Sandbox[] = [];
afterEach(async () => {
  await killAllRunners();
  for (const s of sandboxes.splice(0)) {
    killProcesses(processesMentioning(s.ledger));
    s.cleanup();
  }
  for (const s of servers.splice(0)) await s.close();
});

describe("workspaces across a Runner crash", { timeout: 120_000 }, () => {
  it("records the change of a run whose Runner was killed mid-edit, at the next start, before the hello", async () => {
    const server = await startTestServer();
    servers.push(server);
    const sandbox = worktreeSandbox(server.url);
    sandboxes.push(sandbox);
    const project = join(sandbox.dir, "project");
    const alphabet = "abcdefghijklmnopqrstuvwxyz234567";
    const runId = `wc_agent_run_${Array.from(randomBytes(26), (b) => alphabet[b % 32]).join("")}`;

    const first = startRunner(sandbox);
    const conn1 = await server.nextConnection();
    const start = runStart(conn1, runId, "scenario: edit_file path=notes/edit.txt text=before-the-crash hold=true");
    conn1.send(start);
    expect(await conn1.next(answers(start.request_id))).toMatchObject({ type: "run.start.result" });
    await poll(() => readLedger(sandbox.ledger).some((l) => l.event === "file_edited"), {
      timeoutMs: 60_000,
      what: "the agent's edit",
    });
    const worktree = join(sandbox.stateDir, "workspaces", runId);
    expect(readFileSync(join(worktree, "notes", "edit.txt"), "utf8")).toBe("before-the-crash\n");
    await first.signal("SIGKILL");

    const second = startRunner(sandbox);
    const conn2 = await server.nextConnection();
    // Before the hello: the agent reaped, the change recorded, the worktree gone.
    expect(processesMentioning(sandbox.ledger)).toEqual([]);
    const run = conn2.hello.inventory.find((r) => r.run_id === runId);
    expect(run).toMatchObject({ state: "lost", workspace: { mode: "worktree", branch: `webcodex/run/${runId}` } });
    const head = run?.workspace?.head_commit ?? "";
    expect(head).toMatch(/^[0-9a-f]{40}$/);
    expect(git(project, "show", `${head}:notes/edit.txt`)).toBe("before-the-crash");
    expect(git(project, "log", "-1", "--format=%B", head)).toContain(runId);
    expect(existsSync(worktree)).toBe(false);
    expect(readdirSync(join(sandbox.stateDir, "workspaces"))).toEqual([]);
    expect(git(project, "worktree", "list", "--porcelain")).not.toContain(runId);
    expect(second.output()).toContain("workspaces recovered");

    const ask: RunChangesFrame = { type: "run.changes", request_id: "changes-1", run_id: runId, max_bytes: 4096 };
    conn2.send(ask);
    const answer = await conn2.next(answers(ask.request_id));
    expect(answer).toMatchObject({
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
});
