/**
 * workspace/apply.ts on real git repositories (design §16): the steps of apply_coding_agent_changes without a
 * Runner around them — a merge under way refuses, ignored files are not uncommitted work, and the conflicting paths
 * named are bounded (MAX_APPLY_PATHS).
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { MAX_APPLY_PATHS } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import { applyChange } from "../../src/workspace/apply.js";

const AUTHOR = { name: "Bot", email: "bot@example.invalid" };
const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function repo(): { root: string; git: (...args: string[]) => string } {
  const root = mkdtempSync(join(tmpdir(), "wc-apply-"));
  dirs.push(root);
  const git = (...args: string[]) =>
    execFileSync("git", ["-c", "user.name=t", "-c", "user.email=t@example.invalid", ...args], {
      cwd: root,
      encoding: "utf8",
      stdio: ["ignore", "pipe", "ignore"],
    }).trim();
  git("init", "-q", "-b", "main");
  writeFileSync(join(root, ".gitignore"), "*.log\n");
  writeFileSync(join(root, "a.txt"), "a\n");
  git("add", "-A");
  git("commit", "-q", "-m", "initial");
  return { root, git };
}

/** A run branch off main with `files` written, committed; its head. */
function runBranch(r: ReturnType<typeof repo>, files: Record<string, string>): string {
  r.git("checkout", "-q", "-b", "run");
  for (const [path, text] of Object.entries(files)) writeFileSync(join(r.root, path), text);
  r.git("add", "-A");
  r.git("commit", "-q", "-m", "run");
  const head = r.git("rev-parse", "HEAD");
  r.git("checkout", "-q", "main");
  return head;
}

describe("applyChange", () => {
  it("refuses while a merge is under way in the root, and changes nothing", async () => {
    const r = repo();
    const head = runBranch(r, { "b.txt": "b\n" });
    r.git("checkout", "-q", "-b", "side");
    writeFileSync(join(r.root, "a.txt"), "side\n");
    r.git("commit", "-q", "-am", "side");
    r.git("checkout", "-q", "main");
    writeFileSync(join(r.root, "a.txt"), "main\n");
    r.git("commit", "-q", "-am", "main");
    const mainAt = r.git("rev-parse", "main");
    try {
      r.git("merge", "-q", "side");
    } catch {
      // the conflict leaves the merge under way
    }
    const step = await applyChange(r.root, { runId: "r1", head, target: "main", author: AUTHOR });
    expect(step).toEqual({ kind: "refused", refusal: { reason: "operation_in_progress" } });
    expect(r.git("rev-parse", "main")).toBe(mainAt);
  });

  it("does not count ignored files as uncommitted work, and updates the checked-out tree", async () => {
    const r = repo();
    const head = runBranch(r, { "b.txt": "b\n" });
    writeFileSync(join(r.root, "build.log"), "ignored\n");
    const step = await applyChange(r.root, { runId: "r1", head, target: "main", author: AUTHOR });
    expect(step).toMatchObject({ kind: "done", result: "fast_forward", target_after: head });
    expect(r.git("status", "--porcelain", "--ignored")).toBe("!! build.log");
    expect(r.git("show", "main:b.txt")).toBe("b");
  });

  it("names at most MAX_APPLY_PATHS conflicting paths, and says there were more", async () => {
    const r = repo();
    const count = MAX_APPLY_PATHS + 5;
    const names = Array.from({ length: count }, (_, i) => `f${String(i).padStart(3, "0")}.txt`);
    const head = runBranch(r, Object.fromEntries(names.map((n) => [n, "from the run\n"])));
    for (const n of names) writeFileSync(join(r.root, n), "from main\n");
    r.git("add", "-A");
    r.git("commit", "-q", "-m", "main");
    const mainAt = r.git("rev-parse", "main");
    const step = await applyChange(r.root, { runId: "r1", head, target: "main", author: AUTHOR });
    if (step.kind !== "done") throw new Error(`refused: ${JSON.stringify(step)}`);
    expect(step.result).toBe("conflict");
    expect(step.conflicts?.paths).toEqual(names.slice(0, MAX_APPLY_PATHS));
    expect(step.conflicts?.truncated).toBe(true);
    expect(r.git("rev-parse", "main")).toBe(mainAt);
    expect(r.git("status", "--porcelain")).toBe("");
  });
});
