/**
 * The set-up the workspace tests share: git with a fixed identity, a test workspace's project made a repository,
 * and a runner.toml whose one project "demo" is a `worktree` project run by the fake agent "fake".
 */
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { FAKE_AGENT_BIN } from "../../../../scripts/test-support/index.js";
import type { Workspace } from "./harness.js";

/** git in `cwd` with a fixed author and committer; its trimmed stdout. */
export function git(cwd: string, ...args: string[]): string {
  return execFileSync("git", ["-c", "user.name=t", "-c", "user.email=t@example.invalid", ...args], {
    cwd,
    encoding: "utf8",
  }).trim();
}

/** The workspace's project made a repository on `main` whose one commit ("initial") holds `files`; its head. */
export function commitProject(
  ws: Workspace,
  files: Readonly<Record<string, string>> = { "README.md": "demo\n" },
): string {
  git(ws.projectRoot, "init", "-q", "-b", "main");
  for (const [path, content] of Object.entries(files)) writeFileSync(join(ws.projectRoot, path), content);
  git(ws.projectRoot, "add", "-A");
  git(ws.projectRoot, "commit", "-q", "-m", "initial");
  return git(ws.projectRoot, "rev-parse", "HEAD");
}

export interface WorktreeConfigOptions {
  /** Lines of `[runner]` besides its state_dir. */
  runner?: readonly string[];
  /** Lines of `[acp]` besides agents_share_runner_user. */
  acp?: readonly string[];
  /** The fake agent keeps its sessions in `<dir>/sessions` and resumes them (`continuation = "both"`). */
  continuation?: boolean;
}

/** The runner.toml of the workspace's worktree project, written to `<dir>/runner.toml`: its text and path. */
export function worktreeConfig(ws: Workspace, options: WorktreeConfigOptions = {}): { text: string; file: string } {
  const args = options.continuation
    ? ["--ledger", ws.ledger, "--continuation", "both", "--session-dir", join(ws.dir, "sessions")]
    : ["--ledger", ws.ledger];
  const text = [
    "[runner]",
    `state_dir = ${JSON.stringify(join(ws.dir, "state"))}`,
    ...(options.runner ?? []),
    "[[projects]]",
    'id = "demo"',
    `root = ${JSON.stringify(ws.projectRoot)}`,
    "allow_patch = true",
    'workspace = "worktree"',
    "[acp]",
    "agents_share_runner_user = true",
    ...(options.acp ?? []),
    "[[acp.agents]]",
    'id = "fake"',
    `executable = ${JSON.stringify(FAKE_AGENT_BIN)}`,
    `args = ${JSON.stringify(args)}`,
    ...(options.continuation ? ['continuation = "both"'] : []),
    "[acp.agents.env_from_env]",
    'PATH = "PATH"',
    "",
  ].join("\n");
  const file = join(ws.dir, "runner.toml");
  writeFileSync(file, text);
  return { text, file };
}
