/**
 * A throwaway OS user (and a second group it belongs to) for the run_as
 * tests, created with useradd/groupadd — only possible as root, which CI is.
 * Names are unique per test process; creation is idempotent (an existing
 * account of that name is reused) and `remove()` deletes both.
 *
 * `agentCopy()` copies the built fake agent (bin, dist and the two packages it
 * imports) into a world-readable temp dir, because the checkout may sit under
 * a directory the test user cannot enter (e.g. /root).
 *
 * `sharedTestDir()` is where a run_as test keeps what its agents must see (the
 * agent copy, the project, the ledger): not in /tmp, /var/tmp or /dev/shm,
 * which every run_as agent gets private and empty (process/sandbox.ts).
 */
import { execFile, execFileSync } from "node:child_process";
import { chmodSync, cpSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { REPO_ROOT, RUNNER_BIN } from "../../../../scripts/test-support/index.js";
import { listUidProcesses, readStatusIds } from "../../src/process/proc-identity.js";
import { sweepUser } from "../../src/process/user-pool.js";

export const IS_ROOT = process.getuid?.() === 0;

export interface TestUser {
  readonly name: string;
  readonly uid: number;
  readonly gid: number;
  /** A second group the user is a member of (supplementary). */
  readonly extraGroup: string;
  readonly extraGid: number;
  remove(): void;
}

function run(file: string, args: string[]): string {
  return execFileSync(file, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] }).trim();
}

function exists(database: "passwd" | "group", name: string): boolean {
  try {
    run("getent", [database, name]);
    return true;
  } catch {
    return false;
  }
}

export function createTestUser(tag: string): TestUser {
  const suffix = `${process.pid.toString(36)}${Math.random().toString(36).slice(2, 6)}`;
  const name = `wct${tag}${suffix}`.slice(0, 30);
  const extraGroup = `${name}g`;
  if (!exists("group", extraGroup)) run("groupadd", [extraGroup]);
  if (!exists("passwd", name)) {
    run("useradd", ["--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", "-G", extraGroup, name]);
  }
  const [, , uid, gid] = run("getent", ["passwd", name]).split(":");
  const extraGid = Number(run("getent", ["group", extraGroup]).split(":")[2]);
  return {
    name,
    uid: Number(uid),
    gid: Number(gid),
    extraGroup,
    extraGid,
    remove() {
      try {
        run("userdel", [name]);
      } catch {
        // already gone
      }
      for (const group of [extraGroup, name]) {
        if (exists("group", group)) run("groupdel", [group]);
      }
    },
  };
}

/** Where sharedTestDir() makes its directories: outside the trees a sandboxed run gets private. */
export const SHARED_TEST_ROOT = "/var/lib/webcodex-test";

/** A fresh directory under SHARED_TEST_ROOT that every user can enter (0755); the caller removes it. */
export function sharedTestDir(prefix: string): string {
  mkdirSync(SHARED_TEST_ROOT, { recursive: true, mode: 0o755 });
  const dir = mkdtempSync(join(SHARED_TEST_ROOT, prefix));
  chmodSync(dir, 0o755);
  return dir;
}

/** The fake agent copied to a temp dir every user can read; returns its bin path and a cleanup. */
export function agentCopy(): { bin: string; remove(): void } {
  const dir = sharedTestDir("wc-agent-copy-");
  const agent = join(REPO_ROOT, "fake-acp-agent");
  for (const part of ["bin", "dist", "package.json"]) cpSync(join(agent, part), join(dir, part), { recursive: true });
  for (const pkg of ["@agentclientprotocol/sdk", "zod"]) {
    mkdirSync(join(dir, "node_modules", pkg), { recursive: true });
    cpSync(join(REPO_ROOT, "node_modules", pkg), join(dir, "node_modules", pkg), {
      recursive: true,
      dereference: true,
    });
  }
  // mkdtemp and cpSync keep the source modes; make every directory enterable and every file readable.
  run("chmod", ["-R", "a+rX", dir]);
  return { bin: join(dir, "bin", "fake-acp-agent.js"), remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Longest one `webcodex-runner exec` of a test may take. */
export const EXEC_TIMEOUT_MS = 60_000;

/** `webcodex-runner exec --json` of one prompt on project "demo" with `env`; never throws on a non-zero exit. */
export async function runnerExec(
  configFile: string,
  provider: string,
  prompt: string,
  env: NodeJS.ProcessEnv,
): Promise<{ code: number; stdout: string; stderr: string }> {
  const args = [
    RUNNER_BIN,
    "exec",
    "--config",
    configFile,
    "--project",
    "demo",
    "--provider",
    provider,
    "--json",
    prompt,
  ];
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, args, { env, timeout: EXEC_TIMEOUT_MS });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

/** The real uid of `pid`, or null once it is gone. */
export function uidOf(pid: number): number | null {
  return readStatusIds(pid)?.uids[0] ?? null;
}

/** What a test of a run_as pool sets up: its OS users, the agent copy they may execute, and its temp dir. */
export interface PoolFixture {
  readonly users: readonly TestUser[];
  readonly agent: { remove(): void };
  readonly dir: string;
}

/**
 * Remove a pool fixture and answer what of its users was still running when the test ended (a failed test):
 * that is swept before the users go, and the caller expects it empty.
 */
export async function removePoolFixture(fixture: PoolFixture): Promise<ReturnType<typeof listUidProcesses>> {
  const left = listUidProcesses(new Set(fixture.users.map((u) => u.uid)));
  for (const user of fixture.users) await sweepUser(user.uid);
  for (const user of fixture.users) user.remove();
  fixture.agent.remove();
  rmSync(fixture.dir, { recursive: true, force: true });
  return left;
}

/**
 * The head of a pooled Runner's config: its state dir under `dir`, one project `demo` at `project` that serves
 * several callers (these tests are about pool users; one project serving two callers is sandbox.test.ts's),
 * and `[acp]` with room for four runs and a short cancel grace, then `acp` lines.
 */
export function pooledRunnerHead(dir: string, project: string, acp: readonly string[] = []): string[] {
  return [
    "[runner]",
    `state_dir = ${JSON.stringify(join(dir, "state"))}`,
    "[[projects]]",
    'id = "demo"',
    `root = ${JSON.stringify(project)}`,
    "allow_patch = true",
    "shared_between_callers = true",
    "[acp]",
    "max_concurrent_runs = 4",
    "cancel_grace_secs = 2",
    ...acp,
  ];
}
