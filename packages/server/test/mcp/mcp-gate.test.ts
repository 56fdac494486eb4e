/**
 * The gates in front of `/mcp` (mcp/gate.ts), each alone, on a real HTTP server: CORS answers a preflight and
 * decorates the rest; the Origin gate refuses a foreign Origin with 403; the bearer gate answers 401 with its
 * challenge and closes the socket; the scope gate answers 403 insufficient_scope and reports the refused tools.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { JSONRPCMessage } from "@modelcontextprotocol/server";
import pino from "pino";
import { afterEach, describe, expect, it } from "vitest";
import {
  bearerGate,
  CORS_ALLOW_HEADERS,
  calledTools,
  corsGate,
  type GateLog,
  originGate,
  type ScopeChallenge,
  scopeGate,
} from "../../src/mcp/gate.js";
import { RefusalLog } from "../../src/refusal-log.js";
import { principal } from "../support/fake-runs.js";

const servers: Server[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await new Promise<void>((resolve) => s.close(() => resolve()));
});

/** A real HTTP server whose handler is one gate; a request the gate lets on is answered 200 "passed". */
async function serve(gate: (req: IncomingMessage, res: ServerResponse) => boolean | Promise<boolean>) {
  const server = createServer((req, res) => {
    void (async () => {
      if (await gate(req, res)) res.writeHead(200).end("passed");
    })();
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/mcp`;
}

const log = (): GateLog & { lines: string[] } => {
  const lines: string[] = [];
  const logger = pino({ level: "info" }, { write: (line: string) => lines.push(line) });
  return { refusals: new RefusalLog(logger), clientAddress: () => "127.0.0.1", lines };
};

describe("corsGate", () => {
  it("answers a listed Origin's preflight 204 with the allowed headers, and only decorates its other requests", async () => {
    const url = await serve((req, res) => !corsGate(req, res, ["https://app.example"]));
    const preflight = await fetch(url, { method: "OPTIONS", headers: { Origin: "https://app.example" } });
    expect(preflight.status).toBe(204);
    expect(preflight.headers.get("access-control-allow-origin")).toBe("https://app.example");
    expect(preflight.headers.get("access-control-allow-headers")).toBe(CORS_ALLOW_HEADERS.join(", "));
    const post = await fetch(url, { method: "POST", headers: { Origin: "https://app.example" } });
    expect(post.status).toBe(200);
    expect(post.headers.get("access-control-expose-headers")).toContain("WWW-Authenticate");
    const other = await fetch(url, { method: "OPTIONS", headers: { Origin: "https://other.example" } });
    expect(other.status).toBe(200);
    expect(other.headers.get("access-control-allow-origin")).toBeNull();
  });
});

describe("originGate", () => {
  it("refuses a foreign Origin with 403 and logs it; lets a listed one and no Origin through", async () => {
    const l = log();
    const url = await serve((req, res) => originGate(req, res, ["https://app.example"], "127.0.0.1", l));
    const foreign = await fetch(url, { method: "POST", headers: { Origin: "http://evil.example" } });
    expect(foreign.status).toBe(403);
    expect(((await foreign.json()) as { error: { message: string } }).error.message).toContain("Origin is not allowed");
    expect(l.lines.join("")).toContain("origin not allowed");
    expect((await fetch(url, { method: "POST", headers: { Origin: "https://app.example" } })).status).toBe(200);
    expect((await fetch(url, { method: "POST" })).status).toBe(200);
  });
});

describe("bearerGate", () => {
  it("answers 401 with the static challenge (invalid_token only for a presented token) and never logs the token", async () => {
    const l = log();
    const alice = principal("alice", ["coding_agent:run"], ["demo"]);
    const secret = "wct_not-a-real-token-but-secret";
    const url = await serve(async (req, res) => {
      const p = await bearerGate(req, res, { authenticate: async (t) => (t === "good" ? alice : null) }, l);
      return p !== null;
    });
    const missing = await fetch(url, { method: "POST" });
    expect(missing.status).toBe(401);
    expect(missing.headers.get("www-authenticate")).toBe('Bearer realm="webcodex"');
    expect(missing.headers.get("connection")).toBe("close");
    const invalid = await fetch(url, { method: "POST", headers: { Authorization: `Bearer ${secret}` } });
    expect(invalid.status).toBe(401);
    expect(invalid.headers.get("www-authenticate")).toContain('error="invalid_token"');
    expect((await fetch(url, { method: "POST", headers: { Authorization: "Bearer good" } })).status).toBe(200);
    expect(l.lines.join("")).toContain("mcp request unauthorized");
    expect(l.lines.join("")).not.toContain(secret);
  });
});

describe("scopeGate", () => {
  const call = (name: string): JSONRPCMessage => ({
    jsonrpc: "2.0",
    id: 1,
    method: "tools/call",
    params: { name, arguments: {} },
  });

  it("counts a Tasks request as the run tool it acts as", () => {
    expect(calledTools([call("start_coding_agent")])).toEqual(["start_coding_agent"]);
    expect(calledTools([{ jsonrpc: "2.0", id: 2, method: "tasks/cancel", params: {} }])).toEqual([
      "cancel_coding_agent",
    ]);
    expect(calledTools([{ jsonrpc: "2.0", id: 3, method: "resources/list" }])).toEqual([]);
  });

  it("answers 403 insufficient_scope with the challenge, reporting each refused tool; no challenge lets all on", async () => {
    const p = principal("alice", ["project:read"], ["demo"]);
    const scopes: ScopeChallenge = {
      check: (_p, names) => (names.includes("start_coding_agent") ? ["coding_agent:run"] : null),
      challenge: (wanted) => `Bearer error="insufficient_scope", scope="${wanted.join(" ")}"`,
    };
    const refused: string[] = [];
    const url = await serve((req, res) =>
      scopeGate(res, p, call(req.headers["x-tool"] as string), scopes, (n) => refused.push(n)),
    );
    const denied = await fetch(url, { method: "POST", headers: { "x-tool": "start_coding_agent" } });
    expect(denied.status).toBe(403);
    expect(denied.headers.get("www-authenticate")).toBe('Bearer error="insufficient_scope", scope="coding_agent:run"');
    expect(((await denied.json()) as { error: { message: string } }).error.message).toBe(
      "Forbidden: insufficient_scope (this call needs: coding_agent:run)",
    );
    expect(refused).toEqual(["start_coding_agent"]);
    expect((await fetch(url, { method: "POST", headers: { "x-tool": "observe_coding_agent" } })).status).toBe(200);
    const open = await serve((_req, res) => scopeGate(res, p, call("start_coding_agent"), undefined, () => {}));
    expect((await fetch(open, { method: "POST" })).status).toBe(200);
  });
});
