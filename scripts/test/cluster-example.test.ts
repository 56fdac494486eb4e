/**
 * examples/cluster/start.mjs as a person runs it: PostgreSQL, two Servers on one database, the load
 * balancer, a Runner linked through it. Checks what works before cross-instance routing: the printed MCP URL
 * answers `tools/list` through the load balancer from both instances (the balancer's `x-lb-backend` header
 * names the one that answered, matched against the ports the script prints), and Ctrl-C (SIGINT) stops
 * every process it started.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
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

describe("examples/cluster/start.mjs", () => {
  it(
    "answers MCP through the load balancer from both instances, and Ctrl-C stops every process",
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
