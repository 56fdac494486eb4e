/**
 * A run_as run's workspace (design §16, issue 41 §1): the run's pool user owns it, and nothing the run can write is
 * read by anyone else's git — not another caller's run, not the Runner.
 *
 * It is not a linked worktree (whose admin dir and whose objects and refs live in the project's `.git`, where one
 * caller's run would write what the next one reads), but a repository of its own in `<dir>`, made by the Runner
 * from an empty template: `objects/info/alternates` names the project's object store (read only: the run's
 * commits land in its own), its branch `webcodex/run/<run_id>` at the base, checked out; then handed over
 * (`lchown` of every entry to the pool user, `<dir>` 0700) and only then moved to its name — a `<dir>` that exists
 * is one the Runner finished making. The project's repository stays the operator's: a pool user needs to read
 * its object store, never to write anything of it.
 *
 * The Runner never runs git in the run's repository (its config, hooks, attributes, `commondir` or `.git` file are
 * the run's): the change is recorded in a scratch bare repository of the Runner's own (empty config, alternates:
 * the project's and the run's object stores), with the run's files as work tree and an index of its own — the
 * run's head read from its `HEAD` and refs as data (never followed into a symlink) and checked to be a commit —
 * then the new objects copied into the project (`pack-objects | index-pack --strict`) and the project's branch
 * moved. Whether a workspace is the run's is its directory's owner (which a run cannot change), never anything in
 * it.
 */
import { spawn } from "node:child_process";
import { constants } from "node:fs";
import { chmod, lchown, lstat, mkdir, mkdtemp, open, readdir, rename, rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { WorkspaceAuthor } from "../config/config.js";
import { failpoint } from "../failpoints.js";
import { GIT_TIMEOUT_MS, GitError, type GitOptions, git, invocation } from "./git.js";

/** The pool user a run_as run's workspace is handed to. */
export interface WorkspaceOwner {
  uid: number;
  gid: number;
}

/** Mode of the directory of run_as workspaces: its users may pass through to their own, not list the others. */
export const OWNED_WORKSPACES_DIR_MODE = 0o711;
/** Most bytes of the run's `HEAD` or one loose ref read. */
const RUN_REF_BYTES = 4096;
/** Most bytes of the run's `packed-refs` read (looking for its HEAD's branch). */
const RUN_PACKED_REFS_BYTES = 1024 * 1024;
/** Most entries one workspace may hold when it is handed to its pool user (a checkout of the project). */
export const MAX_OWNED_ENTRIES = 1_000_000;
/** Prefixes of the Runner's own directories beside the workspaces: one being made, a scratch repository. */
export const MAKING_PREFIX = ".making-";
export const RECORDING_PREFIX = ".record-";

const OID = /^[0-9a-f]{40}(?:[0-9a-f]{24})?$/;
const HEAD_REF = /^refs\/heads\/[A-Za-z0-9._/-]{1,200}$/;

/** Whether the workspace at `dir` belongs to a run's pool user (its owner is not the Runner's user). */
export async function runOwned(dir: string): Promise<boolean> {
  try {
    const st = await lstat(dir);
    return st.isDirectory() && st.uid !== process.geteuid?.();
  } catch {
    return false;
  }
}

/** The project's object store (its common git dir's `objects`). */
async function projectObjects(root: string): Promise<string> {
  const common = await git(["rev-parse", "--path-format=absolute", "--git-common-dir"], { cwd: root });
  return join(common.stdout.trim(), "objects");
}

/** Hand every entry under `path` to `owner` without following a symlink; bounded by MAX_OWNED_ENTRIES. */
async function handOver(path: string, owner: WorkspaceOwner): Promise<void> {
  const stack = [path];
  let seen = 0;
  while (stack.length > 0) {
    const next = stack.pop() as string;
    if (++seen > MAX_OWNED_ENTRIES) throw new Error("workspace has too many entries to hand over");
    await lchown(next, owner.uid, owner.gid);
    const st = await lstat(next);
    if (!st.isDirectory()) continue;
    for (const name of await readdir(next)) stack.push(join(next, name));
  }
}

/**
 * Make the run's own repository at `dir` on `branch` at `commit` of the project at `root` (which holds the
 * branch), owned by `owner`. Made under a temporary name beside it and moved there once whole.
 */
export async function makeOwnedWorkspace(
  root: string,
  dir: string,
  branch: string,
  commit: string,
  owner: WorkspaceOwner,
): Promise<void> {
  const parent = dirname(dir);
  await mkdir(parent, { recursive: true, mode: OWNED_WORKSPACES_DIR_MODE });
  await chmod(parent, OWNED_WORKSPACES_DIR_MODE);
  const objects = await projectObjects(root);
  const making = await mkdtemp(join(parent, MAKING_PREFIX));
  try {
    // An empty template: no sample hooks, no info/exclude — nothing of the Runner's host in the run's repository.
    await git(["init", "--quiet", "--template=", "-b", branch, making], { cwd: parent });
    await mkdir(join(making, ".git", "objects", "info"), { recursive: true });
    await writeFile(join(making, ".git", "objects", "info", "alternates"), `${objects}\n`);
    await git(["update-ref", `refs/heads/${branch}`, commit], { cwd: making });
    await git(["reset", "--quiet", "--hard", "HEAD"], { cwd: making });
    await handOver(making, owner);
    await chmod(making, 0o700);
    failpoint("owned_before_rename");
    await rename(making, dir);
    failpoint("owned_after_rename");
  } catch (error) {
    await rm(making, { recursive: true, force: true });
    throw error;
  }
}

/** Up to `max` bytes of the regular file at `path`, never through a symlink or into a FIFO; null when none. */
async function readSmall(path: string, max: number): Promise<string | null> {
  let handle: Awaited<ReturnType<typeof open>>;
  try {
    handle = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch {
    return null;
  }
  try {
    if (!(await handle.stat()).isFile()) return null;
    const buffer = Buffer.alloc(max);
    const { bytesRead } = await handle.read(buffer, 0, max, 0);
    return buffer.subarray(0, bytesRead).toString("utf8");
  } finally {
    await handle.close();
  }
}

/**
 * The commit the run's `HEAD` names, as the run left it (read as data: its `HEAD`, then the loose ref or the
 * `packed-refs` line of its branch), or null when it names none this Runner can read. Not yet checked to exist.
 */
export async function readRunHead(dir: string): Promise<string | null> {
  const gitDir = join(dir, ".git");
  try {
    if (!(await lstat(gitDir)).isDirectory()) return null;
  } catch {
    return null;
  }
  const head = (await readSmall(join(gitDir, "HEAD"), RUN_REF_BYTES))?.trim();
  if (head === undefined) return null;
  if (OID.test(head)) return head;
  if (!head.startsWith("ref: ")) return null;
  const ref = head.slice("ref: ".length);
  if (!HEAD_REF.test(ref) || ref.split("/").some((part) => part === "" || part === "." || part === "..")) return null;
  const loose = (await readSmall(join(gitDir, ...ref.split("/")), RUN_REF_BYTES))?.trim();
  if (loose !== undefined) return OID.test(loose) ? loose : null;
  const packed = await readSmall(join(gitDir, "packed-refs"), RUN_PACKED_REFS_BYTES);
  for (const line of packed?.split("\n") ?? []) {
    const [oid, name] = line.split(" ");
    if (name === ref && oid !== undefined && OID.test(oid)) return oid;
  }
  return null;
}

/** The run's object store, when it is a directory of its own repository (not a symlink out of it). */
async function runObjects(dir: string): Promise<string | null> {
  const objects = join(dir, ".git", "objects");
  try {
    const [gitDir, store] = [await lstat(join(dir, ".git")), await lstat(objects)];
    return gitDir.isDirectory() && store.isDirectory() ? objects : null;
  } catch {
    return null;
  }
}

/** `git <from.args> | git <to.args>` with `input` on the first's stdin; GitError when either fails. */
function gitPipe(
  input: string,
  from: { args: readonly string[]; options: GitOptions },
  to: { args: readonly string[]; options: GitOptions },
): Promise<void> {
  const start = (step: typeof from, stdio: ["pipe", "pipe", "ignore"]) => {
    const { argv, env } = invocation(step.args, step.options);
    return spawn("git", argv, { stdio, env, windowsHide: true });
  };
  const source = start(from, ["pipe", "pipe", "ignore"]);
  const sink = start(to, ["pipe", "pipe", "ignore"]);
  source.stdout.pipe(sink.stdin);
  sink.stdout.resume();
  source.stdin.on("error", () => {});
  sink.stdin.on("error", () => {});
  source.stdin.end(input);
  const timer = setTimeout(() => {
    source.kill("SIGKILL");
    sink.kill("SIGKILL");
  }, GIT_TIMEOUT_MS);
  const ended = (child: typeof source, command: string) =>
    new Promise<void>((resolve, reject) => {
      child.on("error", (error) => reject(new GitError(command, null, { cause: error })));
      child.on("close", (code, signal) =>
        code === 0 ? resolve() : reject(new GitError(command, signal === "SIGKILL" ? "timeout" : code)),
      );
    });
  return Promise.all([ended(source, "pack-objects"), ended(sink, "index-pack")])
    .then(() => undefined)
    .finally(() => clearTimeout(timer));
}

/**
 * Record the change of the run_as workspace at `dir` (see above) onto `branch` of the project at `root`: the run's
 * head (its own commits) when it is a commit, else `base`, plus one commit by `author` of what the run left;
 * answers the new head. Nothing of the run's repository but its objects, its `HEAD` and refs (as data) and its
 * files (as a work tree) is read.
 */
export async function recordOwnedChange(
  root: string,
  dir: string,
  branch: string,
  base: string,
  message: string,
  author: WorkspaceAuthor,
): Promise<string> {
  const scratch = await mkdtemp(join(dirname(dir), RECORDING_PREFIX));
  try {
    await git(["init", "--quiet", "--bare", "--template=", scratch], { cwd: dirname(dir) });
    const stores = [await projectObjects(root), await runObjects(dir)].filter((s): s is string => s !== null);
    await mkdir(join(scratch, "objects", "info"), { recursive: true });
    await writeFile(join(scratch, "objects", "info", "alternates"), `${stores.join("\n")}\n`);
    const inScratch = { cwd: scratch, env: { GIT_DIR: scratch } };
    const isCommit = async (oid: string) =>
      (await git(["rev-parse", "--verify", "--quiet", `${oid}^{commit}`], { ...inScratch, okCodes: [1, 128] })).code ===
      0;
    const runHead = await readRunHead(dir);
    const parent = runHead !== null && (await isCommit(runHead)) ? runHead : base;
    // The run's files as the work tree of the scratch repository, with an index of its own.
    const work: GitOptions = {
      cwd: dir,
      env: { GIT_DIR: scratch, GIT_WORK_TREE: dir, GIT_INDEX_FILE: join(scratch, "record-index") },
    };
    await git(["read-tree", parent], work);
    await git(["add", "--all", "--", "."], work);
    const tree = (await git(["write-tree"], work)).stdout.trim();
    const parentTree = (await git(["rev-parse", `${parent}^{tree}`], inScratch)).stdout.trim();
    let head = parent;
    if (tree !== parentTree) {
      const identity = {
        GIT_AUTHOR_NAME: author.name,
        GIT_AUTHOR_EMAIL: author.email,
        GIT_COMMITTER_NAME: author.name,
        GIT_COMMITTER_EMAIL: author.email,
      };
      const made = await git(["commit-tree", tree, "-p", parent, "-m", message], {
        ...inScratch,
        env: { ...inScratch.env, ...identity },
      });
      head = made.stdout.trim();
    }
    const inProject = await git(["rev-parse", "--verify", "--quiet", `${head}^{commit}`], {
      cwd: root,
      okCodes: [1, 128],
    });
    if (inProject.code !== 0) {
      // Every object of the change the project lacks, copied into its store and checked there.
      failpoint("owned_before_pack");
      await gitPipe(
        `${head}\n^${base}\n`,
        { args: ["pack-objects", "--revs", "--stdout", "--quiet"], options: inScratch },
        { args: ["index-pack", "--stdin", "--strict", "--fix-thin"], options: { cwd: root } },
      );
      failpoint("owned_after_pack");
    }
    await git(["update-ref", `refs/heads/${branch}`, head], { cwd: root });
    return head;
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}
