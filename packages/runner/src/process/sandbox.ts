/**
 * A sandbox per run under `run_as` (design §4.2, `[acp] sandbox`): each agent started as a pool user gets
 * its own mount and IPC namespace, so what one run leaves in the machine's shared scratch places cannot
 * reach another caller's run.
 *
 * The agent is started through util-linux `unshare --mount --ipc --propagation private` (no `--fork`: the
 * pid, and with it the process group the Runner tracks and kills, stays the agent's), which runs a fixed
 * `/bin/sh` script (SANDBOX_SCRIPT) that, inside the new namespaces and still with the Runner's
 * privileges (a non-root Runner's shell is made uid 0 first, with the capabilities the Runner holds: util-linux
 * `mount` refuses any other uid):
 * - mounts a fresh, empty tmpfs (SANDBOX_TMPFS_MIB, mode 1777, nosuid, nodev) on `/tmp`, `/var/tmp` and
 *   `/dev/shm`; a fresh mqueue filesystem on `/dev/mqueue` where that directory exists. The namespace dies
 *   with its last process (the run's tree, which the Runner kills), and its tmpfs mounts with it;
 * - in the project's `.git` directory (when the cwd has one): binds `.git` onto itself, so a run cannot
 *   rename it away and put a repository of its own in its place, and binds `config`, `hooks` and `info`
 *   read-only, so a run cannot plant `core.fsmonitor`, an `include.path`, a hook or an attribute filter
 *   driver that a later run (another caller's, with `shared_between_callers`) would execute;
 * then execs the existing `setpriv` drop (process/run-as.ts), which execs the agent. The operator's argv never
 * enters the script's text: the tools' paths, the git directory and the whole setpriv argv reach it as
 * positional parameters (`"$@"`).
 *
 * The System V IPC objects (shared memory, semaphores, message queues) and POSIX message queues a run
 * creates live in its IPC namespace only and are destroyed with it.
 */
import { spawnSync } from "node:child_process";
import { chownSync, lstatSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import type { RunnerConfig } from "../config/config.js";
import { findSystemTool, type SandboxTools, SYSTEM_TOOL_DIRS } from "../config/run-as.js";
import { SANDBOX_OPT_OUT } from "../config/sandbox-tools.js";

/** Size bound of each private tmpfs (`/tmp`, `/var/tmp`, `/dev/shm`), in MiB: memory a run may fill there. */
export const SANDBOX_TMPFS_MIB = 1024;
/** Longest the start-up probe of the namespaces may take. */
export const SANDBOX_PROBE_TIMEOUT_MS = 10_000;
/** Most bytes of the probe's stderr kept for its refusal message. */
export const SANDBOX_PROBE_STDERR_CHARS = 200;
/** The entries of a project's `.git` that are bound read-only in each run's namespace. */
export const PROTECTED_GIT_ENTRIES = ["config", "hooks", "info"] as const;
/** The directories among PROTECTED_GIT_ENTRIES created (empty) when missing, so a run cannot create them. */
const CREATED_GIT_DIRS = ["hooks", "info"] as const;

/** argv[0] of the script (what `ps` shows for the short moment before the exec). */
const SCRIPT_NAME = "webcodex-sandbox";

/**
 * The fixed script run by `sh -c` inside the new namespaces. Positional parameters: $1 the mount binary,
 * $2 the git directory to protect (empty: none), then the argv to exec.
 */
export const SANDBOX_SCRIPT = [
  "set -e",
  'm="$1"; g="$2"; shift 2',
  `o="mode=1777,nosuid,nodev,size=${SANDBOX_TMPFS_MIB}m"`,
  'for d in /tmp /var/tmp /dev/shm; do if [ -d "$d" ]; then "$m" -t tmpfs -o "$o" tmpfs "$d"; fi; done',
  'if [ -d /dev/mqueue ]; then "$m" -t mqueue -o nosuid,nodev,noexec mqueue /dev/mqueue; fi',
  'if [ -n "$g" ]; then',
  '  "$m" --bind "$g" "$g"',
  `  for e in ${PROTECTED_GIT_ENTRIES.join(" ")}; do`,
  '    if [ -e "$g/$e" ]; then "$m" --bind "$g/$e" "$g/$e"; "$m" -o remount,bind,ro "$g/$e"; fi',
  "  done",
  "fi",
  'exec "$@"',
].join("\n");

/** The argv that starts `inner` (the setpriv command) in a sandbox, protecting `gitDir` when not null. */
export function sandboxCommand(
  tools: SandboxTools,
  gitDir: string | null,
  inner: { file: string; args: readonly string[] },
): { file: string; args: string[] } {
  return {
    file: tools.unshare,
    args: [
      "--mount",
      "--ipc",
      "--propagation",
      "private",
      "--",
      ...(tools.asRoot === null ? [] : [tools.asRoot, "--reuid=0", "--regid=0", "--clear-groups", "--"]),
      tools.sh,
      "-c",
      SANDBOX_SCRIPT,
      SCRIPT_NAME,
      tools.mount,
      gitDir ?? "",
      inner.file,
      ...inner.args,
    ],
  };
}

/**
 * The `.git` directory of a run's cwd to protect, or null (none, or `.git` is a file or a symlink: a linked
 * worktree or a repository elsewhere, not protected; docs/security.md). Missing `hooks` and `info` are
 * created first, owned like `.git`, so that no run can create them with content of its own.
 */
export function prepareGitDir(cwd: string): string | null {
  const gitDir = join(cwd, ".git");
  let owner: { uid: number; gid: number };
  try {
    const st = lstatSync(gitDir);
    if (!st.isDirectory()) return null;
    owner = { uid: st.uid, gid: st.gid };
  } catch {
    return null;
  }
  for (const entry of CREATED_GIT_DIRS) {
    const path = join(gitDir, entry);
    try {
      mkdirSync(path, { mode: 0o755 });
      if (process.geteuid?.() === 0) chownSync(path, owner.uid, owner.gid);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
    }
  }
  return gitDir;
}

/** Why the namespaces cannot be made here, or null when they can: one real sandboxed start of `true`. */
export function probeSandbox(tools: SandboxTools): string | null {
  const truth = findSystemTool("true");
  if (truth === null) return `true not found in ${SYSTEM_TOOL_DIRS.join(", ")}`;
  const command = sandboxCommand(tools, null, { file: truth, args: [] });
  const result = spawnSync(command.file, command.args, {
    cwd: "/",
    env: {},
    stdio: ["ignore", "ignore", "pipe"],
    timeout: SANDBOX_PROBE_TIMEOUT_MS,
    encoding: "utf8",
  });
  if (result.error)
    return `${tools.unshare} could not run (${(result.error as NodeJS.ErrnoException).code ?? "error"})`;
  if (result.status === 0) return null;
  const said = (result.stderr ?? "").trim().split("\n")[0]?.slice(0, SANDBOX_PROBE_STDERR_CHARS) ?? "";
  return said === "" ? `exit status ${result.status ?? result.signal}` : said;
}

/**
 * Why this Runner cannot start its run_as agents in the sandbox its config asks for (one real sandboxed start
 * of `true`, probeSandbox), as a config error line naming `acp.sandbox`; null when it can, or when no
 * agent is sandboxed. `run`, `check` and `exec` refuse with it: a Runner never runs without silently.
 */
export function sandboxRefusal(cfg: RunnerConfig): string | null {
  const tools = cfg.acp.agents.find((a) => a.runAs !== null)?.runAs?.users[0]?.sandbox ?? null;
  if (tools === null) return null;
  const refused = probeSandbox(tools);
  if (refused === null) return null;
  return (
    `${cfg.file}: acp.sandbox: "namespaces" (the default with run_as) gives each run_as agent its own mount and IPC ` +
    `namespace, and this Runner cannot create them (${refused}); run the Runner as root, or give a non-root Runner ` +
    `CAP_SYS_ADMIN as an ambient capability, ${SANDBOX_OPT_OUT}`
  );
}
