/**
 * Test helper: runs `node scripts/demo.mjs` in a temp state folder on a free
 * port, parses the URL and token it prints, tracks every descendant process,
 * and stops it with SIGINT the way a person would.
 *
 * `throughPipe` is `npm start 2>&1 | tee log`: the demo's stdout and stderr go
 * into a reader process that, like tee, dies of SIGINT; stop() sends the
 * terminal's Ctrl-C to the reader first, so the demo shuts down writing into a
 * pipe nobody reads any more.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CLI_BIN, REPO_ROOT as ROOT } from "../test-support/index.js";

export interface DemoStack {
  dir: string;
  url: string;
  token: string;
  process: ChildProcess;
  output(): string;
  /** pid → start time of every live descendant of the demo process. */
  descendants(): Map<number, string>;
  /** SIGINT, wait for exit; resolves with the exit code. */
  stop(): Promise<number | null>;
}

/** Pid, ppid and start time from /proc (Linux). */
function processTable(): Map<number, { ppid: number; start: string }> {
  const table = new Map<number, { ppid: number; start: string }>();
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      // fields[0] = state, [1] = ppid, [19] = starttime
      if (fields[0] === "Z") continue;
      table.set(Number(name), { ppid: Number(fields[1]), start: fields[19] ?? "" });
    } catch {
      // exited meanwhile
    }
  }
  return table;
}

export function descendantsOf(pid: number): Map<number, string> {
  const table = processTable();
  const found = new Map<number, string>();
  const queue = [pid];
  while (queue.length > 0) {
    const parent = queue.pop()!;
    for (const [child, info] of table) {
      if (info.ppid === parent && !found.has(child)) {
        found.set(child, info.start);
        queue.push(child);
      }
    }
  }
  return found;
}

/** The processes of `tracked` that still run (same pid and start time). */
export function survivors(tracked: Map<number, string>): number[] {
  const table = processTable();
  return [...tracked].filter(([pid, start]) => table.get(pid)?.start === start).map(([pid]) => pid);
}

/** The last line scripts/demo.mjs prints before the daemons' logs. */
const BANNER_END = "Ctrl-C here stops the demo";

/** The reader of `throughPipe`: copies stdin to stdout and, like tee, dies of SIGINT. */
const PIPE_READER = "process.stdin.pipe(process.stdout)";

export async function startDemo(
  options: { dir?: string; timeoutMs?: number; throughPipe?: boolean; env?: Record<string, string> } = {},
): Promise<DemoStack> {
  const dir = options.dir ?? mkdtempSync(join(tmpdir(), "webcodex-demo-"));
  const reader = options.throughPipe
    ? spawn(process.execPath, ["-e", PIPE_READER], { stdio: ["pipe", "pipe", "ignore"] })
    : undefined;
  const child = spawn(process.execPath, [join(ROOT, "scripts", "demo.mjs")], {
    cwd: ROOT,
    env: { ...process.env, ...options.env, WEBCODEX_DEMO_DIR: dir, WEBCODEX_DEMO_PORT: "0", NO_COLOR: "1" },
    stdio: reader ? ["ignore", reader.stdin, reader.stdin] : ["ignore", "pipe", "pipe"],
  });
  let output = "";
  for (const stream of reader ? [reader.stdout] : [child.stdout, child.stderr]) {
    stream?.setEncoding("utf8").on("data", (d: string) => {
      output += d;
    });
  }
  const readerExited = reader ? new Promise<void>((res) => reader.once("exit", () => res())) : Promise.resolve();
  const exited = new Promise<number | null>((res) => child.once("exit", (code) => res(code)));
  const seen = new Map<number, string>();
  const track = () => {
    if (child.pid !== undefined) for (const [pid, start] of descendantsOf(child.pid)) seen.set(pid, start);
  };

  const stop = async () => {
    track();
    if (reader && reader.exitCode === null && reader.signalCode === null) {
      reader.kill("SIGINT");
      await readerExited;
    }
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGINT");
    const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
    const code = await exited;
    clearTimeout(timer);
    return code;
  };

  const deadline = Date.now() + (options.timeoutMs ?? 90_000);
  for (;;) {
    const url = /export WEBCODEX_URL=(\S+)/.exec(output)?.[1];
    const token = /export WEBCODEX_TOKEN=(\S+)/.exec(output)?.[1];
    // The last line of the demo's banner: everything it prints before its logs is there.
    if (url !== undefined && token !== undefined && output.includes(BANNER_END)) {
      track();
      return {
        dir,
        url,
        token,
        process: child,
        output: () => output,
        descendants: () => {
          track();
          return new Map(seen);
        },
        stop,
      };
    }
    if (child.exitCode !== null || Date.now() > deadline) {
      await stop();
      throw new Error(`the demo did not become ready:\n${output}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

export function removeDir(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the real `webcodex` executable against a stack. */
export function runCli(
  args: readonly string[],
  env: { url: string; token: string },
  options: { onStdout?: (text: string, child: ChildProcess) => void; timeoutMs?: number } = {},
): Promise<CliResult> {
  return new Promise((res, reject) => {
    const child = spawn(process.execPath, [CLI_BIN, ...args], {
      cwd: ROOT,
      env: { ...process.env, WEBCODEX_URL: env.url, WEBCODEX_TOKEN: env.token, NO_COLOR: "1" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`webcodex ${args.join(" ")} timed out\n${stdout}\n${stderr}`));
    }, options.timeoutMs ?? 60_000);
    child.stdout.setEncoding("utf8").on("data", (d: string) => {
      stdout += d;
      options.onStdout?.(stdout, child);
    });
    child.stderr.setEncoding("utf8").on("data", (d: string) => {
      stderr += d;
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      res({ code, stdout, stderr });
    });
  });
}
