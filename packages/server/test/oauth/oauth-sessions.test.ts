/**
 * OAuth clients and Workflow Sessions (issue 15 over issue 13): `runtime:read` / `runtime:write` are
 * grantable OAuth scopes, the session tools are in TOOL_SCOPES with runtime:* only, and neither ever
 * implies `coding_agent:run`, which stays its own consent line. Real Server child, raw HTTP OAuth flow.
 */
import { createHash, randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { OAUTH_SCOPES, TOOL_SCOPES } from "../../src/oauth/scopes.js";
import { SESSION_TOOL_NAMES } from "../../src/sessions/tools.js";
import { answerConsent, issueKey, mcpPost, openConsent, tokenRequest } from "../support/oauth.js";
import { ProcStack } from "../support/proc-stack.js";

const REDIRECT = "https://app.example/callback";
let stack: ProcStack;
let origin: string;

beforeAll(async () => {
  stack = await new ProcStack({
    runners: [{ id: "r1", projects: ["demo"] }],
    server: "child",
    extraScopes: ["runtime:read", "runtime:write"],
    serverSection: (port) => `public_url = "http://127.0.0.1:${port}"`,
    extraServerToml: "[oauth]\nenabled = true\n",
  }).init();
  origin = `http://127.0.0.1:${stack.port}`;
});

afterAll(async () => {
  await stack?.stop();
});

async function oauthToken(key: string, scope: string): Promise<{ access: string; scope: string }> {
  const reg = await fetch(`${origin}/register`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      client_name: "Sessions app",
      redirect_uris: [REDIRECT],
      token_endpoint_auth_method: "none",
    }),
  });
  const clientId = ((await reg.json()) as { client_id: string }).client_id;
  const verifier = randomBytes(32).toString("base64url");
  const u = new URL(`${origin}/authorize`);
  for (const [k, v] of Object.entries({
    response_type: "code",
    client_id: clientId,
    redirect_uri: REDIRECT,
    code_challenge: createHash("sha256").update(verifier).digest("base64url"),
    code_challenge_method: "S256",
    scope,
    state: "s",
    resource: `${origin}/mcp`,
  }))
    u.searchParams.set(k, v);
  const page = await openConsent(u);
  expect(page.status).toBe(200);
  // The page offers both runtime lines; the user ticks coding_agent:run, but this client is not provisioned for it.
  expect(page.html).toContain("runtime:read");
  expect(page.html).toContain("runtime:write");
  const answered = await answerConsent(origin, page, { action: "approve", key, codingAgentRun: true });
  const code = answered.location?.searchParams.get("code") ?? "";
  const t = await tokenRequest(origin, {
    grant_type: "authorization_code",
    client_id: clientId,
    code,
    code_verifier: verifier,
    redirect_uri: REDIRECT,
  });
  expect(t.status).toBe(200);
  return { access: String(t.body.access_token), scope: String(t.body.scope) };
}

function call(name: string, args: Record<string, unknown>) {
  return { method: "tools/call", params: { name, arguments: args } };
}

describe("OAuth tokens and workflow sessions", () => {
  it("every session tool needs runtime:* only; no runtime scope maps to coding_agent:run", () => {
    expect(OAUTH_SCOPES).toEqual(expect.arrayContaining(["runtime:read", "runtime:write"]));
    expect(TOOL_SCOPES[SESSION_TOOL_NAMES.create]).toEqual(["runtime:write"]);
    expect(TOOL_SCOPES[SESSION_TOOL_NAMES.update]).toEqual(["runtime:write"]);
    expect(TOOL_SCOPES[SESSION_TOOL_NAMES.read]).toEqual(["runtime:read"]);
  });

  it("a token with runtime:* uses the session tools and cannot start runs", async () => {
    const key = await issueKey(
      stack.serverConfigFile,
      "alice",
      ["project:read", "project:write", "runtime:read", "runtime:write", "coding_agent:run"],
      ["demo"],
    );
    const { access, scope } = await oauthToken(key, "project:write runtime:read runtime:write coding_agent:run");
    expect(scope.split(" ").sort()).toEqual(["project:write", "runtime:read", "runtime:write"]);

    const created = await mcpPost(origin, access, call("create_workflow_session", { project_id: "demo", title: "t" }));
    expect(created.status).toBe(200);
    const sessionId = /wc_sess_[a-z2-7]{26}/.exec(created.body)?.[0];
    expect(sessionId, created.body).toBeDefined();
    const updated = await mcpPost(
      origin,
      access,
      call("update_workflow_session", { session_id: sessionId, goal: "g" }),
    );
    expect(updated.status).toBe(200);
    expect(updated.body).not.toContain("isError");
    const read = await mcpPost(origin, access, call("read_workflow_session", { session_id: sessionId }));
    expect(read.status).toBe(200);
    expect(read.body).toContain('\\"goal_version\\":1');

    const start = await mcpPost(
      origin,
      access,
      call("start_coding_agent", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: "oauth-runtime-only",
        prompt: "scenario: hello",
        workflow_session_id: sessionId,
      }),
    );
    expect(start.status).toBe(403);
    expect(start.wwwAuthenticate).toContain('error="insufficient_scope"');
    expect(start.wwwAuthenticate).toContain("coding_agent:run");
  });

  it("a token with runtime:read only cannot write a session", async () => {
    const key = await issueKey(stack.serverConfigFile, "alice", ["runtime:read"], ["demo"]);
    const { access, scope } = await oauthToken(key, "runtime:read runtime:write");
    expect(scope).toBe("runtime:read");
    const created = await mcpPost(origin, access, call("create_workflow_session", { project_id: "demo", title: "t" }));
    expect(created.status).toBe(403);
    expect(created.wwwAuthenticate).toContain("runtime:write");
  });

  it("a tools/call refused for a missing scope (403 insufficient_scope) is audited: one row, outcome forbidden", async () => {
    const key = await issueKey(stack.serverConfigFile, "alice", ["runtime:read"], ["demo"]);
    const { access, scope } = await oauthToken(key, "runtime:read runtime:write");
    expect(scope).toBe("runtime:read");
    const rows = () => stack.stateRows("select principal_id, tool, outcome from mcp_audit order by id");
    const before = (await rows()).length;
    for (const name of ["create_workflow_session", "start_coding_agent"]) {
      const refused = await mcpPost(origin, access, call(name, { project_id: "demo", title: "t" }));
      expect(refused.status).toBe(403);
    }
    await poll(async () => (await rows()).length >= before + 2, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "two new audit rows",
    });
    expect((await rows()).slice(before)).toEqual([
      { principal_id: "alice", tool: "create_workflow_session", outcome: "forbidden" },
      { principal_id: "alice", tool: "start_coding_agent", outcome: "forbidden" },
    ]);
  });
});
