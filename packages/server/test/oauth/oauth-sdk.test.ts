/**
 * Issue 13 acceptance: the official MCP SDK client with its OAuth client
 * provider against a real Server child process, a real Runner and the fake
 * agent. Discovery from a bare 401, dynamic registration and a Client ID
 * Metadata Document on a loopback https host (the dev setting), PKCE,
 * consent (over HTTP here; in a real browser in oauth-browser.test.ts),
 * token, refresh rotation with reuse detection, then a run to completed.
 */
import { auth, UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  answerConsent,
  issueKey,
  makeLoopbackCert,
  mcpPost,
  openConsent,
  serverCli,
  startHttpsHost,
  TestOAuthProvider,
  tokenRequest,
} from "../support/oauth.js";
import { ProcStack } from "../support/proc-stack.js";

let stack: ProcStack;
let origin: string;
let metadataHost: Awaited<ReturnType<typeof startHttpsHost>>;
let runKey: string;
const REDIRECT = "http://127.0.0.1:47123/callback";

beforeAll(async () => {
  // The https host for the metadata document needs its certificate before the Server starts.
  const certDir = (await import("node:fs")).mkdtempSync(`${(await import("node:os")).tmpdir()}/wc-cimd-`);
  const cert = makeLoopbackCert(certDir);
  metadataHost = await startHttpsHost(cert, {
    "/client.json": (_req, res) => {
      res.writeHead(200, { "content-type": "application/json" }).end(
        JSON.stringify({
          client_id: `${metadataHost.origin}/client.json`,
          client_name: "Metadata document client",
          redirect_uris: [REDIRECT],
          grant_types: ["authorization_code", "refresh_token"],
          response_types: ["code"],
          token_endpoint_auth_method: "none",
        }),
      );
    },
  });
  stack = await new ProcStack({
    runners: [{ id: "r1", projects: ["demo"] }],
    server: "child",
    serverEnv: { NODE_EXTRA_CA_CERTS: cert.certFile },
    serverSection: (port) => `public_url = "http://127.0.0.1:${port}"`,
    extraServerToml: "[oauth]\nenabled = true\ndev_allow_loopback_client_metadata = true\n",
  }).init();
  origin = `http://127.0.0.1:${stack.port}`;
  await stack.startRunner("r1");
  runKey = await issueKey(
    stack.serverConfigFile,
    "alice",
    ["coding_agent:run", "project:write", "project:read"],
    ["demo"],
  );
});

afterAll(async () => {
  await stack?.stop();
  await metadataHost?.close();
});

async function connectExpectingRedirect(provider: TestOAuthProvider): Promise<URL> {
  const client = new Client({ name: "oauth-test", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(new URL(`${origin}/mcp`), { authProvider: provider });
  await expect(client.connect(transport)).rejects.toBeInstanceOf(UnauthorizedError);
  if (!provider.authUrl) throw new Error("the SDK client did not start an authorization");
  return provider.authUrl;
}

async function connectWithTokens(provider: TestOAuthProvider): Promise<Client> {
  const client = new Client({ name: "oauth-test", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(`${origin}/mcp`), { authProvider: provider }));
  return client;
}

async function grantsJson(args: string[] = []): Promise<Array<Record<string, unknown>>> {
  const { stdout } = await serverCli([
    "oauth",
    "grants",
    "list",
    "--config",
    stack.serverConfigFile,
    "--json",
    ...args,
  ]);
  return JSON.parse(stdout) as Array<Record<string, unknown>>;
}

describe("OAuth with the MCP SDK client", () => {
  it("answers a bare /mcp request with 401 pointing at RFC 9728 metadata, served at both well-known paths", async () => {
    const r = await mcpPost(origin, null, { method: "tools/list" });
    expect(r.status).toBe(401);
    expect(r.wwwAuthenticate).toContain(`resource_metadata="${origin}/.well-known/oauth-protected-resource/mcp"`);
    expect(r.wwwAuthenticate).toMatch(/scope="[^"]*coding_agent:run[^"]*"/);
    for (const path of ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"]) {
      const prm = (await (await fetch(`${origin}${path}`)).json()) as Record<string, unknown>;
      expect(prm.resource).toBe(`${origin}/mcp`);
      expect(prm.authorization_servers).toEqual([origin]);
    }
    const as = (await (await fetch(`${origin}/.well-known/oauth-authorization-server`)).json()) as Record<
      string,
      unknown
    >;
    expect(as.issuer).toBe(origin);
    expect(as.code_challenge_methods_supported).toEqual(["S256"]);
    expect(as.grant_types_supported).toEqual(["authorization_code", "refresh_token"]);
    expect(as.client_id_metadata_document_supported).toBe(true);
    const bad = await mcpPost(origin, "wcoa_not-a-real-token", { method: "tools/list" });
    expect(bad.status).toBe(401);
    expect(bad.wwwAuthenticate).toContain('error="invalid_token"');
  });

  it("registers dynamically, authorizes with PKCE, refreshes with rotation, and runs the fake agent to completed", async () => {
    const provider = new TestOAuthProvider(REDIRECT, { name: "Dynamic SDK client" });
    const authUrl = await connectExpectingRedirect(provider);
    expect(authUrl.searchParams.get("code_challenge_method")).toBe("S256");
    expect(authUrl.searchParams.get("resource")).toBe(`${origin}/mcp`);
    const clientId = provider.clientInformation()?.client_id ?? "";
    expect(clientId).not.toBe("");
    await serverCli(["oauth", "clients", "allow-coding-agent-run", clientId, "--config", stack.serverConfigFile]);

    const page = await openConsent(authUrl);
    expect(page.status).toBe(200);
    expect(page.html).toContain("Dynamic SDK client");
    const answered = await answerConsent(origin, page, { action: "approve", key: runKey, codingAgentRun: true });
    // The review step offers coding_agent:run as its own unchecked line.
    expect(answered.review).toMatch(/<input type="checkbox" name="coding_agent_run" value="yes">/);
    expect(answered.status).toBe(200);
    const code = answered.location?.searchParams.get("code") ?? "";
    expect(answered.location?.searchParams.get("state")).toBe("st-123");
    await new StreamableHTTPClientTransport(new URL(`${origin}/mcp`), { authProvider: provider }).finishAuth(code);
    const first = provider.tokens();
    expect(first?.scope?.split(" ").sort()).toEqual(["coding_agent:run", "project:read", "project:write"]);
    expect(first?.access_token).toMatch(/^wcoa_/);

    // Refresh: the SDK's auth() rotates; the old refresh token is spent.
    expect(await auth(provider, { serverUrl: new URL(`${origin}/mcp`) })).toBe("AUTHORIZED");
    const second = provider.tokens();
    expect(second?.refresh_token).not.toBe(first?.refresh_token);
    expect(second?.access_token).not.toBe(first?.access_token);
    // A retried refresh inside the reuse grace window gets that same pair, and revokes nothing.
    const retried = await tokenRequest(origin, {
      grant_type: "refresh_token",
      refresh_token: first?.refresh_token ?? "",
      client_id: clientId,
    });
    expect(retried.body.refresh_token).toBe(second?.refresh_token);
    expect(retried.body.access_token).toBe(second?.access_token);

    const client = await connectWithTokens(provider);
    const started = (await client.callTool({
      name: "start_coding_agent",
      arguments: { project_id: "demo", provider_id: "fake", idempotency_key: "oauth-1", prompt: "hello from OAuth" },
    })) as { structuredContent?: { run_id: string; observation_token: string } };
    const runId = started.structuredContent?.run_id ?? "";
    expect(runId).toMatch(/^wc_agent_run_/);
    let state = "";
    let token = started.structuredContent?.observation_token;
    for (let i = 0; i < 40 && state !== "completed"; i++) {
      const obs = (await client.callTool({
        name: "observe_coding_agent",
        arguments: { run_id: runId, wait_secs: 5, ...(token ? { after_observation_token: token } : {}) },
      })) as { structuredContent?: { state: string; observation_token: string } };
      state = obs.structuredContent?.state ?? "";
      token = obs.structuredContent?.observation_token;
    }
    expect(state).toBe("completed");
    await client.close();

    // Once the pair it got was itself rotated, reusing the spent refresh token revokes the whole family:
    // the current access token dies too.
    expect(await auth(provider, { serverUrl: new URL(`${origin}/mcp`) })).toBe("AUTHORIZED");
    const third = provider.tokens();
    expect(third?.refresh_token).not.toBe(second?.refresh_token);
    const reuse = await tokenRequest(origin, {
      grant_type: "refresh_token",
      refresh_token: first?.refresh_token ?? "",
      client_id: clientId,
    });
    expect(reuse.status).toBe(400);
    expect(reuse.body.error).toBe("invalid_grant");
    const after = await mcpPost(origin, third?.access_token ?? "", { method: "tools/list" });
    expect(after.status).toBe(401);
    const grants = await grantsJson(["--client", clientId]);
    expect(grants).toHaveLength(1);
    expect(grants[0]?.revoked_reason).toBe("refresh_reused");
  });

  it("uses a Client ID Metadata Document from a loopback https URL; an unprovisioned client never gets coding_agent:run", async () => {
    const metadataUrl = `${metadataHost.origin}/client.json`;
    const provider = new TestOAuthProvider(REDIRECT, { clientMetadataUrl: metadataUrl });
    const authUrl = await connectExpectingRedirect(provider);
    expect(authUrl.searchParams.get("client_id")).toBe(metadataUrl);
    const page = await openConsent(authUrl);
    expect(page.html).toContain("Metadata document client");
    expect(page.html).not.toContain('name="coding_agent_run"');
    expect(page.html).toContain("not allowed to do that here");
    // Even a forged tick and a key that carries coding_agent:run do not get it.
    const answered = await answerConsent(origin, page, { action: "approve", key: runKey, codingAgentRun: true });
    expect(answered.review).not.toContain('name="coding_agent_run"');
    const code = answered.location?.searchParams.get("code") ?? "";
    await new StreamableHTTPClientTransport(new URL(`${origin}/mcp`), { authProvider: provider }).finishAuth(code);
    expect(provider.tokens()?.scope?.split(" ").sort()).toEqual(["project:read", "project:write"]);

    const client = await connectWithTokens(provider);
    const projects = await client.readResource({ uri: "webcodex://projects" });
    expect(JSON.stringify(projects)).toContain('\\"project_id\\":\\"demo\\"');
    await client.close();
    const start = await mcpPost(origin, provider.tokens()?.access_token ?? "", {
      method: "tools/call",
      params: {
        name: "start_coding_agent",
        arguments: { project_id: "demo", provider_id: "fake", idempotency_key: "cimd-1", prompt: "x" },
      },
    });
    expect(start.status).toBe(403);
    expect(start.wwwAuthenticate).toContain('error="insufficient_scope"');
    expect(start.wwwAuthenticate).toContain("coding_agent:run");
  });
});
