import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import {
  type ClientConnection,
  client,
  ndJsonStream,
  type PromptResponse,
  type RequestPermissionRequest,
  type RequestPermissionResponse,
  type SessionNotification,
  type SessionUpdate,
} from "@agentclientprotocol/sdk";
import { FAKE_AGENT_BIN } from "../../scripts/test-support/index.js";

export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

const live = new Set<ChildProcess>();
const extraPids = new Set<number>();
const tempDirs = new Set<string>();

/** A fresh temp dir, removed by `cleanup()`. */
export function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "fake-acp-agent-test-"));
  tempDirs.add(dir);
  return dir;
}

/** Remember a pid (e.g. a grandchild) that `cleanup()` must SIGKILL. */
export function killLater(pid: number): void {
  extraPids.add(pid);
}

/** Kills every agent and extra pid this file started and removes temp dirs; call from afterEach. */
export async function cleanup(): Promise<void> {
  for (const pid of extraPids) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
  extraPids.clear();
  await Promise.all([...live].map((child) => stop(child, 0)));
  for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true });
  tempDirs.clear();
}

function exitOf(child: ChildProcess): Promise<Exit> {
  if (child.exitCode !== null || child.signalCode !== null) {
    return Promise.resolve({ code: child.exitCode, signal: child.signalCode });
  }
  return new Promise((resolveExit) => child.once("exit", (code, signal) => resolveExit({ code, signal })));
}

/** stdin EOF, then SIGKILL after `graceMs`; resolves with how the child ended. */
async function stop(child: ChildProcess, graceMs: number): Promise<Exit> {
  child.stdin?.end();
  const exited = exitOf(child);
  const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
  try {
    return await exited;
  } finally {
    clearTimeout(timer);
    live.delete(child);
  }
}

export function spawnAgent(args: readonly string[] = [], env: NodeJS.ProcessEnv = process.env): ChildProcess {
  const child = spawn(process.execPath, [FAKE_AGENT_BIN, ...args], { stdio: ["pipe", "pipe", "pipe"], env });
  live.add(child);
  return child;
}

/** Accumulated text of a child's output stream, with a wait for a substring. */
export class TextCapture {
  text = "";
  private readonly waiters = new Set<() => void>();

  constructor(stream: Readable) {
    stream.setEncoding("utf8");
    stream.on("data", (data: string) => {
      this.text += data;
      for (const wake of this.waiters) wake();
    });
  }

  until(substring: string): Promise<void> {
    return new Promise((resolveWait) => {
      const wake = () => {
        if (this.text.includes(substring)) {
          this.waiters.delete(wake);
          resolveWait();
        }
      };
      this.waiters.add(wake);
      wake();
    });
  }
}

export type PermissionHandler = (request: RequestPermissionRequest) => Promise<RequestPermissionResponse>;

/** The fake agent as a child process, driven through the SDK's client side. */
export class AgentUnderTest {
  readonly notifications: SessionNotification[] = [];
  readonly permissionRequests: RequestPermissionRequest[] = [];
  readonly exited: Promise<Exit>;
  readonly stderr: TextCapture;
  readonly connection: ClientConnection;
  private permissionHandler: PermissionHandler = async () => ({ outcome: { outcome: "cancelled" } });
  private readonly sessionPermissionHandlers = new Map<string, PermissionHandler>();
  private readonly waiters = new Set<() => void>();

  constructor(readonly child: ChildProcess) {
    this.exited = exitOf(child);
    this.stderr = new TextCapture(child.stderr!);
    const stream = ndJsonStream(
      Writable.toWeb(child.stdin!),
      Readable.toWeb(child.stdout!) as ReadableStream<Uint8Array>,
    );
    this.connection = client({ name: "fake-acp-agent-test" })
      .onNotification("session/update", ({ params }) => {
        this.notifications.push(params);
        for (const wake of this.waiters) wake();
      })
      .onRequest("session/request_permission", ({ params }) => {
        this.permissionRequests.push(params);
        for (const wake of this.waiters) wake();
        return (this.sessionPermissionHandlers.get(params.sessionId) ?? this.permissionHandler)(params);
      })
      .connect(stream);
  }

  get agent() {
    return this.connection.agent;
  }

  get updates(): SessionUpdate[] {
    return this.notifications.map((n) => n.update);
  }

  /** Answers permission requests (of one session, if given) with `handler`; the default answers `cancelled`. */
  onPermission(handler: PermissionHandler, sessionId?: string): void {
    if (sessionId === undefined) this.permissionHandler = handler;
    else this.sessionPermissionHandlers.set(sessionId, handler);
  }

  /** Resolves once `predicate` holds after some update or permission request arrived. */
  until(predicate: () => boolean): Promise<void> {
    if (predicate()) return Promise.resolve();
    return new Promise((resolveWait) => {
      const wake = () => {
        if (predicate()) {
          this.waiters.delete(wake);
          resolveWait();
        }
      };
      this.waiters.add(wake);
    });
  }

  async initialize() {
    return this.agent.request("initialize", {
      protocolVersion: 1,
      clientInfo: { name: "fake-acp-agent-test", version: "0.0.0" },
      clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
    });
  }

  async newSession(cwd = "/tmp/fake-project") {
    return this.agent.request("session/new", { cwd, mcpServers: [] });
  }

  /** initialize + session/new; returns the session id. */
  async start(cwd?: string): Promise<string> {
    await this.initialize();
    return (await this.newSession(cwd)).sessionId;
  }

  prompt(sessionId: string, text: string): Promise<PromptResponse> {
    return this.agent.request("session/prompt", { sessionId, prompt: [{ type: "text", text }] });
  }

  cancel(sessionId: string): Promise<void> {
    return this.agent.notify("session/cancel", { sessionId });
  }

  /** Agent message text of the updates received so far. */
  messageText(): string {
    return messageText(this.updates);
  }

  /** A new session on this (already initialized) agent, with only its own updates. */
  async session(cwd?: string): Promise<SessionView> {
    return new SessionView(this, (await this.newSession(cwd)).sessionId);
  }

  /** Closes stdin and waits for exit (SIGKILL after `graceMs`). */
  stop(graceMs = 2_000): Promise<Exit> {
    this.connection.close();
    return stop(this.child, graceMs);
  }
}

export function messageText(updates: readonly SessionUpdate[]): string {
  return updates
    .map((u) => (u.sessionUpdate === "agent_message_chunk" && u.content.type === "text" ? u.content.text : ""))
    .join("");
}

/** One session of a shared agent process: lets independent tests reuse one child. */
export class SessionView {
  constructor(
    readonly agent: AgentUnderTest,
    readonly id: string,
  ) {}

  get updates(): SessionUpdate[] {
    return this.agent.notifications.filter((n) => n.sessionId === this.id).map((n) => n.update);
  }

  messageText(): string {
    return messageText(this.updates);
  }

  prompt(text: string): Promise<PromptResponse> {
    return this.agent.prompt(this.id, text);
  }

  cancel(): Promise<void> {
    return this.agent.cancel(this.id);
  }

  get permissionRequests(): RequestPermissionRequest[] {
    return this.agent.permissionRequests.filter((r) => r.sessionId === this.id);
  }

  onPermission(handler: PermissionHandler): void {
    this.agent.onPermission(handler, this.id);
  }

  until(predicate: (view: this) => boolean): Promise<void> {
    return this.agent.until(() => predicate(this));
  }
}

export function startAgent(args: readonly string[] = [], env?: NodeJS.ProcessEnv): AgentUnderTest {
  return new AgentUnderTest(spawnAgent(args, env));
}

/** Resolves `"pending"` if `promise` has not settled within `ms` (used only to show something is *not* answered). */
export function settledWithin<T>(promise: Promise<T>, ms: number): Promise<T | "pending"> {
  return Promise.race([promise, new Promise<"pending">((r) => setTimeout(() => r("pending"), ms))]);
}

/** The fake agent spoken to in raw JSON lines, for output the SDK would refuse to parse. */
export class RawAgent {
  readonly lines: string[] = [];
  readonly exited: Promise<Exit>;
  readonly stderr: TextCapture;
  private partial = "";
  private readonly waiters = new Set<() => void>();

  constructor(readonly child: ChildProcess) {
    this.exited = exitOf(child);
    this.stderr = new TextCapture(child.stderr!);
    child.stdout!.setEncoding("utf8");
    child.stdout!.on("data", (data: string) => {
      const parts = (this.partial + data).split("\n");
      this.partial = parts.pop() ?? "";
      this.lines.push(...parts);
      for (const wake of this.waiters) wake();
    });
  }

  send(message: Record<string, unknown>): void {
    this.child.stdin!.write(`${JSON.stringify({ jsonrpc: "2.0", ...message })}\n`);
  }

  /** Resolves with the first complete stdout line (from the start) matching `predicate`. */
  line(predicate: (line: string) => boolean): Promise<string> {
    return new Promise((resolveLine) => {
      let scanned = 0;
      const wake = () => {
        for (; scanned < this.lines.length; scanned++) {
          const line = this.lines[scanned]!;
          if (predicate(line)) {
            this.waiters.delete(wake);
            resolveLine(line);
            return;
          }
        }
      };
      this.waiters.add(wake);
      wake();
    });
  }

  /** initialize, session/new and one prompt, each sent once the previous answer is back. */
  async prompt(text: string, cwd = "/tmp/fake-project"): Promise<void> {
    this.send({ id: 1, method: "initialize", params: { protocolVersion: 1, clientCapabilities: {} } });
    await this.line((l) => l.startsWith('{"jsonrpc":"2.0","id":1,'));
    this.send({ id: 2, method: "session/new", params: { cwd, mcpServers: [] } });
    const created = JSON.parse(await this.line((l) => l.startsWith('{"jsonrpc":"2.0","id":2,'))) as {
      result: { sessionId: string };
    };
    this.send({
      id: 3,
      method: "session/prompt",
      params: { sessionId: created.result.sessionId, prompt: [{ type: "text", text }] },
    });
  }

  stop(graceMs = 2_000): Promise<Exit> {
    return stop(this.child, graceMs);
  }
}

export function startRawAgent(args: readonly string[] = []): RawAgent {
  return new RawAgent(spawnAgent(args));
}
