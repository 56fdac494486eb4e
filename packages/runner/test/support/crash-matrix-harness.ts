/**
 * Real-process harness for the durability tests: a temp dir per test with a
 * Runner config (fake agent with --ledger), the real `webcodex-runner run`
 * process, and a tiny in-test Server speaking the real protocol frames.
 */
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  type ErrorFrame,
  encodeFrame,
  type HelloFrame,
  parseRunnerFrame,
  type RunnerFrame,
  type RunStartFrame,
  type RunStartResultFrame,
  type ServerFrame,
} from "@webcodex/protocol";
import { type WebSocket, WebSocketServer } from "ws";
import {
  type DaemonProcess,
  FAKE_AGENT_BIN,
  readLedger,
  startRunnerProcess,
} from "../../../../scripts/test-support/index.js";

export const TOKEN_ENV = "WEBCODEX_TEST_RUNNER_TOKEN";
export const TOKEN = "test-runner-token-0123456789";

export interface Sandbox {
  dir: string;
  /** The project's root (a git repository with one commit in `worktree` mode). */
  project: string;
  stateDir: string;
  ledger: string;
  configPath: string;
  cleanup(): void;
}

/** `git` in `cwd` with a throwaway identity; its trimmed stdout. */
export function git(cwd: string, ...args: string[]): string {
  return execFileSync("git", ["-c", "user.name=t", "-c", "user.email=t@example.invalid", ...args], {
    cwd,
    encoding: "utf8",
    stdio: ["ignore", "pipe", "pipe"],
  }).trim();
}

/**
 * A sandbox: `workspace: "worktree"` makes its project a `worktree` project (design §16), its root a git
 * repository with one commit (README.md).
 */
export function makeSandbox(
  options: { serverUrl?: string; agentArgs?: string[]; workspace?: "shared" | "worktree" } = {},
): Sandbox {
  const dir = mkdtempSync(join(tmpdir(), "wc-durable-"));
  const stateDir = join(dir, "state");
  const project = join(dir, "project");
  mkdirSync(project);
  const worktree = options.workspace === "worktree";
  if (worktree) {
    writeFileSync(join(project, "README.md"), "demo\n");
    git(project, "init", "-q", "-b", "main");
    git(project, "add", "-A");
    git(project, "commit", "-q", "-m", "initial");
  }
  const ledger = join(dir, "ledger.jsonl");
  const configPath = join(dir, "runner.toml");
  const lines = [
    "[runner]",
    `state_dir = ${JSON.stringify(stateDir)}`,
    'log_level = "info"',
    ...(options.serverUrl
      ? ["[server]", `url = ${JSON.stringify(options.serverUrl)}`, `token_env = ${JSON.stringify(TOKEN_ENV)}`]
      : []),
    "[[projects]]",
    'id = "demo"',
    `root = ${JSON.stringify(project)}`,
    "allow_patch = true",
    ...(worktree ? ['workspace = "worktree"'] : []),
    "[acp]",
    "agents_share_runner_user = true",
    "max_concurrent_runs = 2",
    "setup_timeout_secs = 20",
    "cancel_grace_secs = 2",
    "[[acp.agents]]",
    'id = "fake"',
    'name = "Fake"',
    `executable = ${JSON.stringify(FAKE_AGENT_BIN)}`,
    `args = ${JSON.stringify(["--ledger", ledger, ...(options.agentArgs ?? [])])}`,
    "[acp.agents.env_from_env]",
    'PATH = "PATH"',
  ];
  writeFileSync(configPath, `${lines.join("\n")}\n`);
  return {
    dir,
    project,
    stateDir,
    ledger,
    configPath,
    cleanup: () => rmSync(dir, { recursive: true, force: true }),
  };
}

/** How long `stop()` gives a Runner after SIGTERM before SIGKILL. */
const RUNNER_STOP_GRACE_MS = 15_000;

const live = new Set<DaemonProcess>();

/**
 * `webcodex-runner run` on the sandbox's config, with only PATH and the link
 * token in its environment (plus `extraEnv` and the failpoint); `output()`
 * holds its stderr (its log).
 */
export function startRunner(
  sandbox: Sandbox,
  options: { newStore?: boolean; failpoint?: string; extraEnv?: Record<string, string> } = {},
): DaemonProcess {
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? "/usr/bin:/bin",
    [TOKEN_ENV]: TOKEN,
    ...options.extraEnv,
  };
  if (options.failpoint) env.WEBCODEX_FAILPOINT = options.failpoint;
  const runner = startRunnerProcess(sandbox.configPath, {
    args: options.newStore ? ["--new-store"] : [],
    env,
    capture: "stderr",
    stopGraceMs: RUNNER_STOP_GRACE_MS,
  });
  live.add(runner);
  void runner.exited.then(() => live.delete(runner));
  return runner;
}

/** SIGKILL every Runner this harness started that is still running, and wait for each to exit (afterEach). */
export async function killAllRunners(): Promise<void> {
  await Promise.all([...live].map((runner) => runner.signal("SIGKILL")));
}

/** Pids of the grandchildren the fake agent logged (`scenario: grandchild`). */
export function ledgerGrandchildren(ledger: string): number[] {
  return readLedger(ledger)
    .filter((line) => line.event === "grandchild")
    .map((line) => line.pid)
    .filter((pid): pid is number => typeof pid === "number");
}

/** Every byte the store left on disk: the database and its WAL/SHM files. */
export function storeBytes(stateDir: string): Buffer {
  const parts: Buffer[] = [];
  for (const name of readdirSync(stateDir)) {
    if (name.startsWith("dispatch.sqlite")) parts.push(readFileSync(join(stateDir, name)));
  }
  return Buffer.concat(parts);
}

// ---- frames and branches -------------------------------------------------------------

/**
 * A `run.start` of run `runId` in project `demo` for provider `providerId` as `conn`'s Runner advertised it in its
 * hello (its instance ids), with a request id of its own; `fingerprint`: the intent's, random unless given.
 */
export function runStartFrame(
  conn: RunnerConnection,
  providerId: string,
  runId: string,
  prompt: string,
  fingerprint: string = randomBytes(32).toString("hex"),
): RunStartFrame {
  const provider = conn.hello.providers.find((p) => p.provider_id === providerId);
  if (!provider) throw new Error(`runner did not advertise the ${providerId} provider`);
  return {
    type: "run.start",
    request_id: `req-${randomBytes(6).toString("hex")}`,
    run_id: runId,
    intent_fingerprint: fingerprint,
    project_id: "demo",
    provider_id: providerId,
    agent_instance_id: conn.hello.agent_instance_id,
    provider_instance_id: provider.provider_instance_id,
    prompt,
    config: {},
    timeout_secs: null,
  };
}

/** Matches the answer to the `run.start` whose request id is `requestId`: its result or its error. */
export function startAnswerTo(requestId: string) {
  return (f: RunnerFrame): f is RunStartResultFrame | ErrorFrame =>
    (f.type === "run.start.result" || f.type === "error") && f.request_id === requestId;
}

/** The tip of run `runId`'s branch in `project`, or undefined when the branch does not exist. */
export function branchTip(project: string, runId: string): string | undefined {
  try {
    return git(project, "rev-parse", "--verify", "--quiet", `refs/heads/webcodex/run/${runId}^{commit}`);
  } catch {
    return undefined;
  }
}

/** The file at `path` on run `runId`'s branch in `project`, or undefined when the branch or the file is not there. */
export function onBranch(project: string, runId: string, path: string): string | undefined {
  try {
    return git(project, "show", `refs/heads/webcodex/run/${runId}:${path}`);
  } catch {
    return undefined;
  }
}

// ---- a tiny Server ----------------------------------------------------------------

export interface RunnerConnection {
  hello: HelloFrame;
  send(frame: ServerFrame): void;
  /** Next frame matching `pred` (frames already received are searched first). */
  next<T extends RunnerFrame>(pred: (f: RunnerFrame) => f is T, ms?: number): Promise<T>;
  frames: RunnerFrame[];
  closed: Promise<void>;
}

export interface TestServer {
  url: string;
  /** The next Runner connection, once its hello arrived (hello.ack is sent). */
  nextConnection(ms?: number): Promise<RunnerConnection>;
  close(): Promise<void>;
}

export async function startTestServer(): Promise<TestServer> {
  const wss = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  await new Promise<void>((r) => wss.once("listening", () => r()));
  const port = (wss.address() as AddressInfo).port;
  const pending: RunnerConnection[] = [];
  const waiters: ((c: RunnerConnection) => void)[] = [];
  const sockets = new Set<WebSocket>();

  wss.on("connection", (ws, req) => {
    sockets.add(ws);
    ws.once("close", () => sockets.delete(ws));
    if (req.headers.authorization !== `Bearer ${TOKEN}`) {
      ws.close(4401, "unauthorized");
      return;
    }
    const frames: RunnerFrame[] = [];
    const listeners = new Set<() => void>();
    let resolveClosed: () => void = () => {};
    const closed = new Promise<void>((r) => {
      resolveClosed = r;
    });
    ws.once("close", () => resolveClosed());
    let announced = false;
    ws.on("message", (data) => {
      const parsed = parseRunnerFrame(data.toString());
      if (!parsed.ok) throw new Error(`runner sent an invalid frame: ${parsed.error.message}`);
      const frame = parsed.frame;
      if (frame.type === "heartbeat") {
        ws.send(encodeFrame({ type: "heartbeat", sent_at: new Date().toISOString() }));
        return;
      }
      if (!announced) {
        if (frame.type !== "hello") throw new Error(`first frame was ${frame.type}`);
        announced = true;
        ws.send(
          encodeFrame({
            type: "hello.ack",
            runner_id: "test-runner",
            server_instance_id: "test_server_instance_0001",
            heartbeat_interval_ms: 10_000,
            resume_secret: "resume_secret_for_tests_0000000000000000000",
          }),
        );
        const conn: RunnerConnection = {
          hello: frame,
          frames,
          closed,
          send: (f) => ws.send(encodeFrame(f)),
          next: (pred, ms = 20_000) =>
            new Promise((resolveNext, reject) => {
              let index = 0;
              const check = () => {
                for (; index < frames.length; index++) {
                  const f = frames[index]!;
                  if (pred(f)) {
                    cleanup();
                    resolveNext(f);
                    return;
                  }
                }
              };
              const timer = setTimeout(() => {
                cleanup();
                reject(new Error("timed out waiting for a runner frame"));
              }, ms);
              const cleanup = () => {
                clearTimeout(timer);
                listeners.delete(check);
              };
              listeners.add(check);
              check();
            }),
        };
        const waiter = waiters.shift();
        if (waiter) waiter(conn);
        else pending.push(conn);
        return;
      }
      frames.push(frame);
      for (const l of [...listeners]) l();
    });
  });

  return {
    url: `ws://127.0.0.1:${port}/runner`,
    nextConnection: (ms = 20_000) =>
      new Promise((resolveConn, reject) => {
        const ready = pending.shift();
        if (ready) {
          resolveConn(ready);
          return;
        }
        const timer = setTimeout(() => reject(new Error("no runner connected")), ms);
        waiters.push((c) => {
          clearTimeout(timer);
          resolveConn(c);
        });
      }),
    close: async () => {
      for (const ws of sockets) ws.terminate();
      await new Promise<void>((r) => wss.close(() => r()));
    },
  };
}
