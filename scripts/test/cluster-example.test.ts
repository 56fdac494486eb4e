/**
 * examples/cluster/start.mjs as a person runs it: PostgreSQL, two Servers on one database, the load
 * balancer, a Runner linked through it. Checks what works before cross-instance routing: the printed MCP URL
 * answers `tools/list` through the load balancer from both instances (the balancer's `x-lb-backend` header
 * names the one that answered, matched against the ports the script prints), and Ctrl-C (SIGINT) stops
 * every process it started.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { killProcesses, poll, processesMentioning, REPO_ROOT } from "../test-support/index.js";
import { BACKEND_HEADER } from "../test-support/load-balancer.js";
import { descendantsOf, removeDir, survivors } from "./demo-stack.js";

/** Bound on initdb, two Servers and the Runner coming up on a shared 2-core machine. */
const CLUSTER_READY_MS = 120_000;
/** Bound on the ordered stop after SIGINT (Runner, Servers, load balancer, PostgreSQL). */
const CLUSTER_STOP_MS = 60_000;
/** Bound on one MCP call through the load balancer. */
const MCP_CALL_MS = 10_000;
/** Longest one observe long-poll waits for news (seconds). */
const OBSERVE_WAIT_SECS = 5;
/** Most observe calls one run may take before the test gives up on it. */
const MAX_OBSERVES = 20;
/** Time between two looks at the script's output. */
const OUTPUT_POLL_MS = 100;

let cleanup: (() => void) | undefined;
afterEach(() => {
  cleanup?.();
  cleanup = undefined;
});

async function toolsList(url: string, token: string): Promise<{ backend: string | null; tools: string[] }> {
  const res = await fetch(url, {
    method: "POST",
    headers: {
      authorization: `Bearer ${token}`,
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": "2025-06-18",
    },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list", params: {} }),
    signal: AbortSignal.timeout(MCP_CALL_MS),
  });
  const text = await res.text();
  expect(res.status, text).toBe(200);
  // JSON or a one-event SSE stream, whichever the Server chose.
  const json = JSON.parse(res.headers.get("content-type")?.includes("event-stream") ? text.split("data: ")[1]! : text);
  return { backend: res.headers.get(BACKEND_HEADER), tools: json.result.tools.map((t: { name: string }) => t.name) };
}

/** One 2025-era tools/call through the load balancer: the structured result and which instance answered. */
async function callTool(
  url: string,
  token: string,
  name: string,
  args: Record<string, unknown>,
): Promise<{ backend: string | null; result: Record<string, unknown> }> {
  const res = await fetch(url, {
    method: "POST",
    headers: {
      authorization: `Bearer ${token}`,
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": "2025-06-18",
    },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/call", params: { name, arguments: args } }),
    signal: AbortSignal.timeout(MCP_CALL_MS + OBSERVE_WAIT_SECS * 1000),
  });
  const text = await res.text();
  expect(res.status, text).toBe(200);
  const json = JSON.parse(res.headers.get("content-type")?.includes("event-stream") ? text.split("data: ")[1]! : text);
  expect(json.result?.isError, text).not.toBe(true);
  return { backend: res.headers.get(BACKEND_HEADER), result: json.result.structuredContent };
}

/** A run started through the load balancer and observed through it until it ends; returns its id and end. */
async function runThroughBalancer(url: string, token: string, key: string) {
  const start = await callTool(url, token, "start_coding_agent", {
    project_id: "demo",
    provider_id: "fake",
    idempotency_key: key,
    prompt: "scenario: hello",
  });
  const runId = start.result.run_id as string;
  let cursor = start.result.observation_token as string;
  let state = start.result.state as string;
  const observedOn = new Set<string | null>();
  for (let i = 0; i < MAX_OBSERVES && !["completed", "failed", "cancelled", "lost"].includes(state); i++) {
    const seen = await callTool(url, token, "observe_coding_agent", {
      run_id: runId,
      after_observation_token: cursor,
      wait_secs: OBSERVE_WAIT_SECS,
    });
    observedOn.add(seen.backend);
    cursor = seen.result.observation_token as string;
    state = seen.result.state as string;
  }
  return { runId, startedOn: start.backend, observedOn, state, replayed: start.result.replayed };
}

/** Whether something accepts a TCP connection on 127.0.0.1:`port`. */
function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host: "127.0.0.1", port });
    socket.setTimeout(MCP_CALL_MS);
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("timeout", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

describe("examples/cluster/start.mjs", () => {
  it(
    "`start.mjs | tee log` and a terminal's Ctrl-C (SIGINT to the whole foreground group) stop both Servers",
    async () => {
      const dir = mkdtempSync(join(tmpdir(), "webcodex-cluster-tee-"));
      // Apart from the cluster's folder, which PostgreSQL's user must be able to enter.
      const logDir = mkdtempSync(join(tmpdir(), "webcodex-cluster-log-"));
      const log = join(logDir, "log");
      const script = join(REPO_ROOT, "examples", "cluster", "start.mjs");
      // As a shell runs a pipeline: node and tee in one process group, the one a terminal's Ctrl-C signals.
      const shell: ChildProcess = spawn(
        "sh",
        ["-c", `"$0" "$1" 2>&1 | tee "$2" > /dev/null`, process.execPath, script, log],
        {
          cwd: REPO_ROOT,
          env: { ...process.env, WEBCODEX_CLUSTER_DIR: dir },
          stdio: "ignore",
          detached: true,
        },
      );
      const read = () => {
        try {
          return readFileSync(log, "utf8");
        } catch {
          return "";
        }
      };
      cleanup = () => {
        killProcesses([...descendantsOf(shell.pid!).keys(), shell.pid!]);
        killProcesses(processesMentioning(dir));
        removeDir(dir);
        removeDir(logDir);
      };
      await poll(() => /^Ctrl-C stops everything\.$/m.test(read()), {
        timeoutMs: CLUSTER_READY_MS,
        intervalMs: OUTPUT_POLL_MS,
        what: () => `the cluster to be up; output:\n${read()}`,
      });
      const ports = ["server-a", "server-b"].map((name) =>
        Number(new RegExp(`^${name}: http://127\\.0\\.0\\.1:(\\d+)$`, "m").exec(read())?.[1]),
      );
      for (const port of ports) expect(await listening(port), `port ${port} before Ctrl-C`).toBe(true);

      process.kill(-shell.pid!, "SIGINT");
      await poll(async () => !(await listening(ports[0]!)) && !(await listening(ports[1]!)), {
        timeoutMs: CLUSTER_STOP_MS,
        intervalMs: OUTPUT_POLL_MS * 5,
        what: () => `both Servers (ports ${ports.join(", ")}) to stop after Ctrl-C; output:\n${read()}`,
      });
      await poll(() => processesMentioning(dir).length === 0, {
        timeoutMs: CLUSTER_STOP_MS,
        intervalMs: OUTPUT_POLL_MS * 5,
        what: () => `every process of the cluster to end: ${processesMentioning(dir).join(", ")}`,
      });
    },
    CLUSTER_READY_MS + 2 * CLUSTER_STOP_MS,
  );

  it(
    "answers MCP through the load balancer from both instances, runs and observes through it, and Ctrl-C stops every process",
    async () => {
      const dir = mkdtempSync(join(tmpdir(), "webcodex-cluster-"));
      let output = "";
      const child: ChildProcess = spawn(process.execPath, [join(REPO_ROOT, "examples", "cluster", "start.mjs")], {
        cwd: REPO_ROOT,
        env: { ...process.env, WEBCODEX_CLUSTER_DIR: dir },
        stdio: ["ignore", "pipe", "pipe"],
      });
      for (const stream of [child.stdout, child.stderr]) stream?.on("data", (d: Buffer) => (output += d.toString()));
      const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
      cleanup = () => {
        killProcesses([...descendantsOf(child.pid!).keys(), child.pid!]);
        killProcesses(processesMentioning(dir));
        removeDir(dir);
      };

      const printed = await poll(
        () => {
          if (child.exitCode !== null) throw new Error(`the script exited (${child.exitCode}):\n${output}`);
          const url = /^MCP URL: (\S+)$/m.exec(output)?.[1];
          const token = /^Token: +(\S+)$/m.exec(output)?.[1];
          return url !== undefined && token !== undefined && { url, token };
        },
        { timeoutMs: CLUSTER_READY_MS, intervalMs: OUTPUT_POLL_MS, what: () => `the MCP URL; output:\n${output}` },
      );
      const instancePorts = ["server-a", "server-b"].map((name) => {
        const port = new RegExp(`^${name}: http://127\\.0\\.0\\.1:(\\d+)$`, "m").exec(output)?.[1];
        expect(port, `${name}'s URL in the output`).toBeDefined();
        return `127.0.0.1:${port}`;
      });
      const balancerPort = new URL(printed.url).port;
      expect(instancePorts).not.toContain(`127.0.0.1:${balancerPort}`);

      const answers = [await toolsList(printed.url, printed.token), await toolsList(printed.url, printed.token)];
      expect(answers.map((a) => a.backend).sort()).toEqual([...instancePorts].sort());
      for (const answer of answers) expect(answer.tools).toContain("start_coding_agent");

      // Runs through the load balancer: whichever instance takes the start or an observe, the one without the
      // Runner's link forwards to the one with it. The second start is sent when the balancer's next turn is
      // the instance that did not take the first (how many observes the first run took is timing), so the
      // two starts land on both instances.
      const keys = [`cluster-a-${process.pid}-${Date.now()}`, `cluster-b-${process.pid}-${Date.now()}`];
      const runs = [];
      for (const key of keys) {
        const first = runs[0];
        if (first !== undefined) {
          for (let i = 0; i < instancePorts.length; i++) {
            if ((await toolsList(printed.url, printed.token)).backend === first.startedOn) break;
          }
        }
        runs.push(await runThroughBalancer(printed.url, printed.token, key));
      }
      expect(runs.map((r) => r.state)).toEqual(["completed", "completed"]);
      expect(runs.map((r) => r.replayed)).toEqual([false, false]);
      expect(new Set(runs.map((r) => r.startedOn)).size).toBe(2);
      // The same key again, through the next instance in turn: the same run, replayed, nothing started again.
      for (const [i, key] of keys.entries()) {
        const again = await callTool(printed.url, printed.token, "start_coding_agent", {
          project_id: "demo",
          provider_id: "fake",
          idempotency_key: key,
          prompt: "scenario: hello",
        });
        expect(again.result).toMatchObject({ run_id: runs[i]?.runId, replayed: true, state: "completed" });
      }

      const tracked = descendantsOf(child.pid!);
      // Runner, two Servers, PostgreSQL and its own workers.
      expect(tracked.size).toBeGreaterThanOrEqual(4);
      expect(processesMentioning(dir).length).toBeGreaterThanOrEqual(4);
      child.kill("SIGINT");
      const code = await Promise.race([
        exited,
        new Promise<never>((_, reject) =>
          setTimeout(() => reject(new Error(`no exit after SIGINT:\n${output}`)), CLUSTER_STOP_MS),
        ),
      ]);
      expect(code, output).toBe(0);
      expect(output).toMatch(/^stopped$/m);
      expect(survivors(tracked)).toEqual([]);
      expect(processesMentioning(dir)).toEqual([]);
    },
    CLUSTER_READY_MS + CLUSTER_STOP_MS,
  );
});
