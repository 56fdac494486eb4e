/**
 * The one way the Runner runs git for workspaces (design §16): an argument array (never a shell), a bounded time
 * and output, a scrubbed environment, and overrides that keep what a project (or a run) can write into its git
 * config from running as the Runner: no hooks, no fsmonitor, no external diff or textconv, no pager, no prompts.
 */
import { execFile, spawn } from "node:child_process";

/** Longest one git command of a workspace may take. */
export const GIT_TIMEOUT_MS = 60_000;
/** Most stdout one git command may write (a diff is bounded separately: MAX_CHANGE_DIFF_BYTES). */
export const GIT_MAX_OUTPUT_BYTES = 4 * 1024 * 1024;
/** Most stderr kept for the local log's error name (never sent anywhere). */
const GIT_STDERR_BYTES = 64 * 1024;

/** Config overrides on every command: what a repository's own config could make git execute. */
const SAFE_CONFIG = [
  "core.hooksPath=/dev/null",
  "core.fsmonitor=false",
  "core.untrackedCache=false",
  "core.pager=cat",
  "diff.external=",
  "protocol.allow=never",
  "commit.gpgSign=false",
  "tag.gpgSign=false",
  "gc.auto=0",
  "maintenance.auto=false",
];

export class GitError extends Error {
  override readonly name = "GitError";
  constructor(
    /** The git subcommand (never its arguments: they may name refs or paths). */
    readonly command: string,
    readonly code: number | string | null,
    options?: { cause?: unknown },
  ) {
    super(`git ${command} failed (${String(code)})`, options);
  }
}

export interface GitOptions {
  /** Directory the command runs in (`git -C`). */
  cwd: string;
  /** Extra environment (author identity); PATH, HOME and LC_ALL are set here. */
  env?: Record<string, string>;
  maxBytes?: number;
  /** Exit codes that are answers, not failures (e.g. 1 from `diff --quiet`). */
  okCodes?: readonly number[];
  /** Ends the command (SIGKILL) when aborted: a GitError with code `aborted` (git() only). */
  signal?: AbortSignal;
}

/** The argv and environment of `git <args>` as every workspace command runs it (gitPipe in owned.ts too). */
export function invocation(args: readonly string[], options: GitOptions): { argv: string[]; env: NodeJS.ProcessEnv } {
  return {
    argv: [...SAFE_CONFIG.flatMap((c) => ["-c", c]), "-C", options.cwd, ...args],
    env: {
      PATH: process.env.PATH ?? "/usr/bin:/bin",
      HOME: process.env.HOME ?? "/nonexistent",
      LC_ALL: "C",
      GIT_CONFIG_NOSYSTEM: "1",
      // The Runner user's own ~/.gitconfig does not shape a run's workspace either.
      GIT_CONFIG_GLOBAL: "/dev/null",
      GIT_TERMINAL_PROMPT: "0",
      GIT_OPTIONAL_LOCKS: "0",
      ...options.env,
    },
  };
}

/**
 * The first `limit` bytes of `git <args>`'s stdout (the command is killed once it wrote more), whether it wrote
 * more than that, and its exit code (null when it was cut). For output that may be longer than anything we hold
 * (a diff, a list of paths).
 */
export function gitPrefix(
  args: readonly string[],
  options: GitOptions,
  limit: number,
): Promise<{ stdout: Buffer; truncated: boolean; code: number | null }> {
  const { argv, env } = invocation(args, options);
  const command = args.find((a) => !a.startsWith("-")) ?? "?";
  return new Promise((resolve, reject) => {
    const child = spawn("git", argv, { stdio: ["ignore", "pipe", "ignore"], env, windowsHide: true });
    const chunks: Buffer[] = [];
    let size = 0;
    let truncated = false;
    const timer = setTimeout(() => child.kill("SIGKILL"), GIT_TIMEOUT_MS);
    child.stdout.on("data", (chunk: Buffer) => {
      if (truncated) return;
      chunks.push(chunk);
      size += chunk.length;
      if (size > limit) {
        truncated = true;
        child.kill("SIGKILL");
      }
    });
    child.on("error", (error) => {
      clearTimeout(timer);
      reject(new GitError(command, (error as NodeJS.ErrnoException).code ?? null, { cause: error }));
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      if (!truncated && code !== 0 && !(code !== null && options.okCodes?.includes(code))) {
        reject(new GitError(command, signal === "SIGKILL" ? "timeout" : code));
        return;
      }
      resolve({ stdout: Buffer.concat(chunks).subarray(0, limit), truncated, code: truncated ? null : code });
    });
  });
}

/** Run `git <args>`: stdout (UTF-8 or raw) and the exit code; GitError on anything else. */
export function git(args: readonly string[], options: GitOptions): Promise<{ stdout: string; code: number }>;
export function git(
  args: readonly string[],
  options: GitOptions & { raw: true },
): Promise<{ stdout: Buffer; code: number }>;
export function git(
  args: readonly string[],
  options: GitOptions & { raw?: true },
): Promise<{ stdout: string | Buffer; code: number }> {
  const { argv, env } = invocation(args, options);
  const command = args.find((a) => !a.startsWith("-")) ?? "?";
  return new Promise((resolve, reject) => {
    execFile(
      "git",
      argv,
      {
        encoding: options.raw ? "buffer" : "utf8",
        timeout: GIT_TIMEOUT_MS,
        killSignal: "SIGKILL",
        maxBuffer: Math.max(options.maxBytes ?? GIT_MAX_OUTPUT_BYTES, GIT_STDERR_BYTES),
        windowsHide: true,
        env,
        ...(options.signal ? { signal: options.signal } : {}),
      },
      (error, stdout) => {
        const code = error ? (error as { code?: unknown }).code : 0;
        if (error && options.signal?.aborted) {
          reject(new GitError(command, "aborted", { cause: error }));
          return;
        }
        if (!error || (typeof code === "number" && options.okCodes?.includes(code))) {
          resolve({ stdout, code: typeof code === "number" ? code : 0 });
          return;
        }
        const why = typeof code === "number" || typeof code === "string" ? code : null;
        reject(new GitError(command, (error as { killed?: boolean }).killed ? "timeout" : why, { cause: error }));
      },
    );
  });
}
