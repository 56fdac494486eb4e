/**
 * The stdio bridge as a real child process (`webcodex-server mcp-stdio`, from
 * dist) in front of /mcp served over real HTTP with an in-test RunsApi. The
 * full-stack happy path through the bridge is in mcp-acceptance.test.ts.
 */
import { execFile } from "node:child_process";
import { createServer, type Server as HttpServer } from "node:http";
import type { AddressInfo } from "node:net";
import { promisify } from "node:util";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { SERVER_BIN } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";
import { MemoryAuditLog } from "../../src/mcp/audit.js";
import { createMcpHttpHandler } from "../../src/mcp/http.js";
import { FakeRuns, principal } from "../support/fake-runs.js";

const run = promisify(execFile);
const alice = principal("alice", ["coding_agent:run", "project:write", "project:read"], ["demo"]);
const cleanups: (() => Promise<void>)[] = [];

afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function serveMcp(port = 0): Promise<{ http: HttpServer; port: number }> {
  const handler = createMcpHttpHandler({
    runs: new FakeRuns(),
    audit: new MemoryAuditLog(),
    logger: pino({ level: "silent" }),
    authenticate: async (token) => (token === "token-alice" ? alice : null),
  });
  const http = createServer((req, res) => void handler(req, res));
  await new Promise<void>((resolve) => http.listen(port, "127.0.0.1", resolve));
  cleanups.push(async () => {
    await handler.close();
    http.closeAllConnections();
    await new Promise<void>((resolve) => http.close(() => resolve()));
  });
  return { http, port: (http.address() as AddressInfo).port };
}

function bridge(port: number, token: string): StdioClientTransport {
  return new StdioClientTransport({
    command: process.execPath,
    args: [SERVER_BIN, "mcp-stdio", "--url", `http://127.0.0.1:${port}/mcp`, "--token-env", "WC_BRIDGE_TOKEN"],
    env: { ...(process.env as Record<string, string>), WC_BRIDGE_TOKEN: token },
    stderr: "pipe",
  });
}

describe("webcodex-server mcp-stdio", () => {
  it("exits 1 at start-up when the Server refuses the token, without printing it", async () => {
    const wrongToken = canary("bridge-token");
    const { port } = await serveMcp();
    const failed = await run(
      process.execPath,
      [SERVER_BIN, "mcp-stdio", "--url", `http://127.0.0.1:${port}/mcp`, "--token-env", "WC_BRIDGE_TOKEN"],
      { env: { ...process.env, WC_BRIDGE_TOKEN: wrongToken } },
    ).catch((e: { code: number; stderr: string; stdout: string }) => e);
    expect((failed as { code: number }).code).toBe(1);
    expect((failed as { stderr: string }).stderr).toContain("refused the token (401)");
    expect((failed as { stderr: string }).stderr).not.toContain(wrongToken);
    expect((failed as { stdout: string }).stdout).toBe("");
  });

  it("refuses to start without the token variable", async () => {
    const failed = await run(
      process.execPath,
      [SERVER_BIN, "mcp-stdio", "--url", "http://127.0.0.1:9/mcp", "--token-env", "WC_UNSET_VAR"],
      { env: { ...process.env, WC_UNSET_VAR: "" } },
    ).catch((e: { code: number; stderr: string }) => e);
    expect((failed as { code: number }).code).toBe(2);
    expect((failed as { stderr: string }).stderr).toContain("WC_UNSET_VAR");
  });

  it("starts before the Server, answers calls with an error meanwhile, and forwards once it is up", async () => {
    // A port that was free a moment ago; the Server comes up on it later.
    const probe = await serveMcp();
    const port = probe.port;
    await cleanups.pop()?.();
    const client = new Client({ name: "stdio-test", version: "0" });
    await client.connect(bridge(port, "token-alice"));
    cleanups.push(() => client.close());
    await expect(client.listTools()).rejects.toThrow(/could not be reached/);
    await serveMcp(port);
    const { tools } = await client.listTools();
    expect(tools.map((t) => t.name).sort()).toEqual([
      "apply_coding_agent_changes",
      "cancel_coding_agent",
      "get_coding_agent_changes",
      "observe_coding_agent",
      "start_coding_agent",
    ]);
    const bad = await client.callTool({ name: "observe_coding_agent", arguments: { run_id: "x", cwd: "/" } });
    expect(bad.isError).toBe(true);
    expect((bad.content as { text: string }[])[0]?.text).toContain("'cwd'");
  });
});
