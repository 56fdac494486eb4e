/**
 * Paging a recorded change (design §16, `get_coding_agent_changes`) over a real git repository: the listing and
 * where each file's diff lies are computed once per (base, head) and cached; a later page runs git once, for the
 * diff of its own files. The pages put together are exactly `git diff base head`, whatever the files (renames, a
 * type change, binary, paths with spaces, glob characters and non-ASCII), and the cache is bounded.
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, unlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import {
  type ChangeIndex,
  ChangeIndexCache,
  DIFF_FLAGS,
  GIT,
  type GitRunner,
} from "../../src/workspace/change-index.js";
import { type ChangeDeps, changePage } from "../../src/workspace/changes.js";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function git(cwd: string, ...args: string[]): string {
  return execFileSync("git", ["-c", "user.name=t", "-c", "user.email=t@example.invalid", ...args], {
    cwd,
    encoding: "utf8",
    maxBuffer: 64 * 1024 * 1024,
  });
}

/** A repository whose head changes 40 files every way git lists them; its base, head and the whole diff. */
function repository(): { root: string; base: string; head: string; whole: string } {
  const root = mkdtempSync(join(tmpdir(), "wc-change-pages-"));
  dirs.push(root);
  git(root, "init", "-q", "-b", "main");
  mkdirSync(join(root, "src"));
  const body = (i: number) => Array.from({ length: 30 }, (_, l) => `line ${l} of file ${i}\n`).join("");
  for (let i = 0; i < 30; i++) writeFileSync(join(root, "src", `f${i}.txt`), body(i));
  writeFileSync(join(root, "typed"), "a file, then a link\n");
  writeFileSync(join(root, "moved.txt"), body(99));
  git(root, "add", "-A");
  git(root, "commit", "-q", "-m", "base");
  const base = git(root, "rev-parse", "HEAD").trim();
  for (let i = 0; i < 30; i += 2) writeFileSync(join(root, "src", `f${i}.txt`), `${body(i)}changed ${i}\n`);
  for (let i = 1; i < 10; i += 2) unlinkSync(join(root, "src", `f${i}.txt`));
  for (const name of ["with space.txt", "glob*[a].txt", "été ✎.txt", "-dash.txt"]) {
    writeFileSync(join(root, "src", name), `${name}\n${body(7)}`);
  }
  writeFileSync(join(root, "blob.bin"), Buffer.from([0, 1, 2, 3, 0, 255]));
  unlinkSync(join(root, "typed"));
  symlinkSync("src/f0.txt", join(root, "typed"));
  git(root, "mv", "moved.txt", "src/renamed.txt");
  git(root, "add", "-A");
  git(root, "commit", "-q", "-m", "head");
  const head = git(root, "rev-parse", "HEAD").trim();
  const whole = git(root, "diff", ...DIFF_FLAGS, base, head, "--");
  return { root, base, head, whole };
}

/** A runner over the real git that counts its calls. */
function counting(): { run: GitRunner; calls: string[][] } {
  const calls: string[][] = [];
  return {
    calls,
    run: {
      git: (args, options) => {
        calls.push([...args]);
        return GIT.git(args, options);
      },
      gitPrefix: (args, options, limit) => {
        calls.push([...args]);
        return GIT.gitPrefix(args, options, limit);
      },
    },
  };
}

async function allPages(
  repo: { root: string; base: string; head: string },
  maxBytes: number,
  deps: ChangeDeps,
): Promise<{ diff: string; pages: number }> {
  let diff = "";
  let pages = 0;
  let offset = 0;
  for (;;) {
    const page = await changePage(repo.root, repo.base, repo.head, offset, maxBytes, deps);
    pages += 1;
    expect(Buffer.byteLength(JSON.stringify(page.diff))).toBeLessThanOrEqual(maxBytes);
    diff += page.diff;
    if (page.next_offset === null) return { diff, pages };
    expect(page.next_offset).toBeGreaterThan(offset);
    offset = page.next_offset;
  }
}

describe("change pages", () => {
  it("pages put together are the whole diff; N pages run N + 2 git commands, and one each once the pair is indexed", async () => {
    const repo = repository();
    const { run, calls } = counting();
    const deps = { cache: new ChangeIndexCache(), run };
    const { diff, pages } = await allPages(repo, 1024, deps);
    expect(pages).toBeGreaterThan(5);
    expect(diff).toBe(repo.whole);
    // The listing, the numstat and the whole diff once (the first page is cut from it); one diff a later page.
    expect(calls.length).toBe(pages + 2);
    expect(calls.filter((c) => c.includes("--name-status"))).toHaveLength(1);
    expect(calls.filter((c) => c.includes("--numstat"))).toHaveLength(1);
    // Each later page names only its own files: never the whole diff again.
    const later = calls.slice(3);
    expect(later.every((c) => c.indexOf("--") < c.length - 1)).toBe(true);
    expect(Math.max(...later.map((c) => c.length - c.indexOf("--") - 1))).toBeLessThan(15);

    // Paged again: the index is cached, one command a page.
    calls.length = 0;
    const again = await allPages(repo, 1024, deps);
    expect(again.diff).toBe(repo.whole);
    expect(calls.length).toBe(again.pages);

    // The files as listed: every status, the binary file, the rename with its old path.
    const first = await changePage(repo.root, repo.base, repo.head, 0, 1024, deps);
    const byPath = new Map(first.files.map((f) => [f.path, f]));
    expect(byPath.get("src/renamed.txt")).toMatchObject({ status: "renamed", old_path: "moved.txt" });
    expect(byPath.get("blob.bin")).toMatchObject({ status: "added", binary: true });
    expect(byPath.get("src/f1.txt")).toMatchObject({ status: "deleted", deletions: 30 });
    expect(byPath.get("src/f0.txt")).toMatchObject({ status: "modified", insertions: 1, deletions: 0 });
    expect(byPath.get("src/glob*[a].txt")).toMatchObject({ status: "added" });
    expect(byPath.get("typed")).toMatchObject({ status: "modified" });
  });

  it("a page whose files' diff does not match what was indexed reads the whole diff instead: pages stay exact", async () => {
    const repo = repository();
    const { run, calls } = counting();
    const cache = new ChangeIndexCache();
    await changePage(repo.root, repo.base, repo.head, 0, 1024, { cache, run });
    const index = cache.get(ChangeIndexCache.key(repo.root, repo.base, repo.head)) as ChangeIndex;
    for (const piece of index.pieces ?? []) piece.digest = "spoiled";
    calls.length = 0;
    const { diff, pages } = await allPages(repo, 4096, { cache, run });
    expect(diff).toBe(repo.whole);
    // Each page: its files' diff, refused, then the whole diff.
    expect(calls.length).toBe(2 * pages);
  });

  it("keeps at most its count and its bytes of indexes, least recently used out first", () => {
    const index = (bytes: number): ChangeIndex => ({
      files: [],
      files_truncated: false,
      diff_bytes: 0,
      diff_truncated: false,
      pieces: [],
      bytes,
    });
    const cache = new ChangeIndexCache(2, 1000);
    cache.set("a", index(100));
    cache.set("b", index(100));
    expect(cache.get("a")).toBeDefined();
    cache.set("c", index(100));
    expect([cache.size, cache.bytes]).toEqual([2, 200]);
    expect(cache.get("b")).toBeUndefined();
    expect(cache.get("a")).toBeDefined();
    cache.set("d", index(850));
    expect([cache.size, cache.bytes]).toEqual([2, 950]);
    // Over the count (a goes), then still over the bytes (d goes).
    cache.set("f", index(500));
    expect([cache.size, cache.bytes]).toEqual([1, 500]);
    expect(cache.get("a")).toBeUndefined();
    expect(cache.get("d")).toBeUndefined();
    expect(cache.get("f")).toBeDefined();
    // One bigger than the whole bound is not kept (its pages are computed as before).
    cache.set("e", index(1001));
    expect(cache.get("e")).toBeUndefined();
    expect([cache.size, cache.bytes]).toEqual([1, 500]);
  });
});
