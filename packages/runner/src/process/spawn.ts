/**
 * Spawning an ACP agent child (with execa) and owning its whole process tree
 * (design §4.2).
 *
 * The child gets exactly the variables of its `env_from_env` mapping
 * (`extendEnv: false`), resolved from the Runner's own environment right
 * before the spawn, and with `run_as` the pool user's own HOME, USER and LOGNAME (`runAsEnv`); its own process group (`detached: true`, so pgid = pid);
 * cwd = the project root; stdin/stdout pipes for ACP; stderr drained and
 * discarded (only a byte count is kept); no other descriptor (inherited ones
 * are covered by /dev/null, see process/inherited-fds.ts), in a descriptor table sized
 * so its start-up need not grow it (process/fd-table.ts). With `run_as` the agent is
 * started through setpriv as the run's pool user (process/run-as.ts), in a mount and IPC namespace of its
 * own (process/sandbox.ts): same pid and group; what leaves the group is the pool's sweep's
 * (process/user-pool.ts).
 * Cleanup after every run: stdin EOF → grace → SIGTERM to the group → grace →
 * SIGKILL to the tree and the group. execa only starts the child: no buffering,
 * no rejection, no kill on the Runner's exit (the cleanup above and the reaper
 * own the tree); its cost per start is in the bench's start-to-dispatch breakdown.
 */
import { once } from "node:events";
import { Readable, Writable } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import { execa, type Options } from "execa";
import treeKill from "tree-kill";
import type { AgentConfig } from "../config/config.js";
import type { RunAs } from "../config/run-as.js";
import { reserveAgentFdTable } from "./fd-table.js";
import { inheritedFdStdio } from "./inherited-fds.js";
import { listGroupMembers, procIdentitySupported, readStartTime } from "./proc-identity.js";
import { runAsEnv, setprivCommand } from "./run-as.js";
import { prepareGitDir, sandboxCommand } from "./sandbox.js";
import { STDERR_TAIL_BYTES, TailBuffer } from "./stderr-tail.js";

export type EnvResolution =
  | { ok: true; env: Record<string, string> }
  | { ok: false; missingSource: string; childName: string };

/** Resolve `env_from_env` from `source` (the Runner's env). A missing source names the source variable only. */
export function resolveChildEnv(agent: Pick<AgentConfig, "envFromEnv">, source: NodeJS.ProcessEnv): EnvResolution {
  const env: Record<string, string> = {};
  for (const [childName, sourceName] of Object.entries(agent.envFromEnv)) {
    const value = source[sourceName];
    if (value === undefined) return { ok: false, missingSource: sourceName, childName };
    env[childName] = value;
  }
  return { ok: true, env };
}

/** The spawn itself failed (ENOENT, EACCES, …). `code` is the errno code only. */
export class SpawnError extends Error {
  override readonly name = "SpawnError";
  constructor(
    readonly code: string,
    options?: { cause?: unknown },
  ) {
    super(`agent process could not be started (${code})`, options);
  }
}

export interface ChildExit {
  code: number | null;
  signal: string | null;
}

export interface AgentChild {
  readonly pid: number;
  /** Process group id (= pid: the child leads its own group). */
  readonly pgid: number;
  /** /proc start time of the group leader, or null where /proc is unavailable. */
  readonly startTime: string | null;
  /** The child's stdin and stdout as web streams, for the ACP SDK's ndJsonStream. */
  readonly stdin: WritableStream<Uint8Array>;
  readonly stdout: ReadableStream<Uint8Array>;
  /** Resolves once the group leader has exited. */
  readonly exited: Promise<ChildExit>;
  readonly exit: ChildExit | null;
  /** Bytes the child wrote to stderr. */
  readonly stderrBytes: number;
  /** The last STDERR_TAIL_BYTES of stderr, unredacted (runs/diagnostics.ts redacts it before writing). */
  stderrTail(): string;
  /** Close stdin → grace → SIGTERM group → grace → SIGKILL tree + group. Idempotent; resolves when nothing is left. */
  terminateTree(graceMs: number): Promise<TreeCleanup>;
}

export interface TreeCleanup {
  /** The last step that was needed: the child went on stdin EOF, on SIGTERM, or needed SIGKILL. */
  escalation: "eof" | "sigterm" | "sigkill";
  /** Whether any member of the group survived even SIGKILL's grace (should never happen). */
  survivors: number;
}

export interface SpawnOptions {
  agent: Pick<AgentConfig, "executable" | "args">;
  /** The OS user to start the agent as (a run's pool user); absent or null: the Runner's user. */
  runAs?: RunAs | null;
  cwd: string;
  env: Record<string, string>;
  /**
   * Called synchronously once the OS has started the child (the exec succeeded), before spawnAgent first
   * awaits: the caller records the group's identity there, so no await separates the fork from that record.
   */
  onStarted?: (pid: number, startTime: string | null) => void;
}

const POLL_MS = 25;

/** Whether any non-zombie process is still in the group (falls back to kill(−pgid, 0) without /proc). */
export function groupAlive(pgid: number): boolean {
  if (procIdentitySupported()) return listGroupMembers(pgid).length > 0;
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
}

async function waitGroupGone(pgid: number, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (!groupAlive(pgid)) return true;
    if (Date.now() >= deadline) return false;
    // Not unref'd: a pending cleanup must keep the process alive (exec has nothing else holding it).
    await sleep(POLL_MS);
  }
}

function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // ESRCH: the group is already gone.
  }
}

/**
 * What starts the agent: itself; as a pool user, setpriv; and under `[acp] sandbox = "namespaces"`, that
 * setpriv inside a mount and IPC namespace of its own (process/sandbox.ts) that protects the cwd's `.git`.
 */
export function agentCommand(
  runAs: RunAs | null,
  executable: string,
  args: readonly string[],
  cwd: string,
): { file: string; args: string[] } {
  if (runAs === null) return { file: executable, args: [...args] };
  const setpriv = setprivCommand(runAs, executable, args);
  return runAs.sandbox === null ? setpriv : sandboxCommand(runAs.sandbox, prepareGitDir(cwd), setpriv);
}

/** Spawn the agent and wait for the `spawn` event. Throws SpawnError if the OS refuses. */
export async function spawnAgent(options: SpawnOptions): Promise<AgentChild> {
  const { executable, args } = options.agent;
  const runAs = options.runAs;
  const command = agentCommand(runAs ?? null, executable, args, options.cwd);
  // Descriptors this process inherited without close-on-exec are covered by /dev/null in the child
  // (an integer stdio entry is child_process's "dup this fd here").
  const masked = inheritedFdStdio();
  // The Runner's command line reserved it at start; a RunManager embedded elsewhere does so here, once.
  reserveAgentFdTable();
  const subprocess = execa(command.file, command.args, {
    cwd: options.cwd,
    // A pool user's HOME is its own (never a mapped one, which config load refuses): what one caller's run
    // leaves there is not read by another caller's runs.
    env: runAs ? { ...options.env, ...runAsEnv(runAs) } : options.env,
    extendEnv: false,
    detached: true,
    // An integer entry is "dup this descriptor here": /dev/null over each inherited one. execa's types
    // list descriptors up to 9 only; at run time it hands any integer entry to child_process as is.
    stdio: ["pipe", "pipe", "pipe", ...masked.extra] as Options["stdio"],
    // The streams are the ACP transport and the stderr drain below, read as they arrive; execa keeps
    // no copy. Each is consumed before spawnAgent returns, so execa never resumes one itself.
    buffer: false,
    // A failure is the `error` event below (SpawnError) or the exit; the result promise never rejects.
    reject: false,
    // The tree is the Runner's to end (terminateTree, the reaper): nothing is killed when the Runner exits.
    cleanup: false,
  });
  // execa spawns synchronously, and libuv returns from the spawn only after the exec (or with its
  // error): a pid here is a running agent.
  const startedPid = subprocess.pid;
  const startTime = startedPid === undefined ? null : readStartTime(startedPid);
  if (startedPid !== undefined) options.onStarted?.(startedPid, startTime);

  try {
    await Promise.race([
      once(subprocess, "spawn"),
      once(subprocess, "error").then(([error]) => {
        throw error;
      }),
    ]);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException)?.code ?? "unknown";
    throw new SpawnError(code, { cause: error });
  } finally {
    masked.close();
  }
  const pid = subprocess.pid;
  if (pid === undefined) throw new SpawnError("no_pid");

  const stdinNode = subprocess.stdin;
  const stdoutNode = subprocess.stdout;
  const stderrNode = subprocess.stderr;
  if (!stdinNode || !stdoutNode || !stderrNode) throw new SpawnError("no_pipes");

  // Stream errors (EPIPE after the child died, …) surface through the ACP
  // connection; the Node streams must not crash the Runner with an unhandled 'error'.
  stdinNode.on("error", () => {});
  stdoutNode.on("error", () => {});
  stderrNode.on("error", () => {});

  let stderrBytes = 0;
  const tail = new TailBuffer(STDERR_TAIL_BYTES);
  stderrNode.on("data", (chunk: Buffer) => {
    stderrBytes += chunk.length;
    tail.push(chunk);
  });

  let exit: ChildExit | null = null;
  const exited = new Promise<ChildExit>((resolve) => {
    subprocess.once("exit", (code: number | null, signal: NodeJS.Signals | null) => {
      exit = { code, signal };
      resolve(exit);
    });
  });

  let cleanup: Promise<TreeCleanup> | null = null;

  const terminate = async (graceMs: number): Promise<TreeCleanup> => {
    stdinNode.end();
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([exited, new Promise<void>((resolve) => (timer = setTimeout(resolve, graceMs)))]);
    clearTimeout(timer);
    if (exit !== null && !groupAlive(pid)) return { escalation: "eof", survivors: 0 };

    signalGroup(pid, "SIGTERM");
    if (await waitGroupGone(pid, graceMs)) return { escalation: "sigterm", survivors: 0 };

    // Stragglers: walk the tree from the leader while it is still alive (catches
    // descendants that left the group) — never once it exited, as its pid may
    // be reused — then kill the whole group.
    if (exit === null) await new Promise<void>((resolve) => treeKill(pid, "SIGKILL", () => resolve()));
    signalGroup(pid, "SIGKILL");
    const gone = await waitGroupGone(pid, graceMs);
    return { escalation: "sigkill", survivors: gone ? 0 : listGroupMembers(pid).length };
  };

  return {
    pid,
    pgid: pid,
    startTime,
    stdin: Writable.toWeb(stdinNode) as WritableStream<Uint8Array>,
    stdout: Readable.toWeb(stdoutNode) as ReadableStream<Uint8Array>,
    exited,
    get exit() {
      return exit;
    },
    get stderrBytes() {
      return stderrBytes;
    },
    stderrTail: () => tail.text(),
    terminateTree(graceMs: number) {
      cleanup ??= terminate(graceMs);
      return cleanup;
    },
  };
}
