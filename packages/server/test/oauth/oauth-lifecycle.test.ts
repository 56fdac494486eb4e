/**
 * Issue 13 audit gaps, against a real Server child process over raw HTTP:
 * RFC 7009 revocation (access token, refresh family, unknown token, another
 * client's token), the oauth_audit rows of provisioning and grant revocation
 * (and that no token, code or key lands there), fixed token-endpoint error
 * descriptions, and lifetimes — an expired access token and a code older than
 * CODE_TTL_MS — seen through the test-only OAuth clock skew
 * (WEBCODEX_TEST_HOOK_OAUTH_CLOCK_SKEW_MS) after a Server restart.
 */
import { createHash, randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FIXED_ERROR_DESCRIPTIONS } from "../../src/oauth/http.js";
import { CODE_TTL_MS } from "../../src/oauth/store.js";
import { OAUTH_TEST_CLOCK_ENV } from "../../src/oauth/test-clock.js";
import { answerConsent, issueKey, mcpPost, openConsent, serverCli, tokenRequest } from "../support/oauth.js";
import { ProcStack } from "../support/proc-stack.js";

const REDIRECT = "https://app.example/callback";
const ACCESS_TTL_SECS = 60;

let stack: ProcStack;
let origin: string;
let runKey: string;
/** Every secret value this file saw: none may appear in oauth_audit. */
const canaries = new Set<string>();

beforeAll(async () => {
  stack = await new ProcStack({
    runners: [],
    server: "child",
    serverSection: (port) => `public_url = "http://127.0.0.1:${port}"`,
    extraServerToml: `[oauth]\nenabled = true\naccess_token_ttl_secs = ${ACCESS_TTL_SECS}\n`,
  }).init();
  origin = `http://127.0.0.1:${stack.port}`;
  runKey = await issueKey(stack.serverConfigFile, "alice", ["coding_agent:run", "project:write", "project:read"], []);
  canaries.add(runKey);
});

afterAll(async () => {
  await stack?.stop();
});

function cli(...args: string[]) {
  return serverCli([...args, "--config", stack.serverConfigFile]);
}

async function register(): Promise<string> {
  const res = await fetch(`${origin}/register`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      client_name: "Lifecycle client",
      redirect_uris: [REDIRECT],
      token_endpoint_auth_method: "none",
    }),
  });
  expect(res.status).toBe(201);
  return ((await res.json()) as { client_id: string }).client_id;
}

/** Register (unless given a client), consent with the run key, and return the unredeemed code. */
async function codeFor(opts: { clientId?: string; codingAgentRun?: boolean } = {}) {
  const clientId = opts.clientId ?? (await register());
  const verifier = randomBytes(32).toString("base64url");
  const u = new URL(`${origin}/authorize`);
  const params = {
    response_type: "code",
    client_id: clientId,
    redirect_uri: REDIRECT,
    code_challenge: createHash("sha256").update(verifier).digest("base64url"),
    code_challenge_method: "S256",
    scope: "coding_agent:run project:write project:read",
    state: "s1",
    resource: `${origin}/mcp`,
  };
  for (const [k, v] of Object.entries(params)) u.searchParams.set(k, v);
  const page = await openConsent(u);
  expect(page.status).toBe(200);
  const answered = await answerConsent(origin, page, {
    action: "approve",
    key: runKey,
    codingAgentRun: opts.codingAgentRun ?? false,
  });
  const code = answered.location?.searchParams.get("code");
  if (!code) throw new Error(`no code (status ${answered.status})`);
  canaries.add(code);
  return { clientId, code, verifier };
}

async function exchange(c: { clientId: string; code: string; verifier: string }) {
  const r = await tokenRequest(origin, {
    grant_type: "authorization_code",
    client_id: c.clientId,
    code: c.code,
    code_verifier: c.verifier,
    redirect_uri: REDIRECT,
  });
  return r;
}

/** A fresh client with a live token pair. */
async function pair(): Promise<{ clientId: string; access: string; refresh: string }> {
  const c = await codeFor();
  const r = await exchange(c);
  expect(r.status).toBe(200);
  const access = String(r.body.access_token);
  const refresh = String(r.body.refresh_token);
  canaries.add(access);
  canaries.add(refresh);
  return { clientId: c.clientId, access, refresh };
}

async function refreshWith(clientId: string, refresh: string) {
  const r = await tokenRequest(origin, { grant_type: "refresh_token", refresh_token: refresh, client_id: clientId });
  if (r.status === 200) {
    canaries.add(String(r.body.access_token));
    canaries.add(String(r.body.refresh_token));
  }
  return r;
}

async function revoke(form: Record<string, string>): Promise<{ status: number; body: string }> {
  const res = await fetch(`${origin}/revoke`, {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams(form),
  });
  return { status: res.status, body: await res.text() };
}

const LIST = { method: "tools/list" };

describe("OAuth token revocation (RFC 7009)", () => {
  it("a revoked access token gets 401 at the next request; the rest of its family keeps working", async () => {
    const p = await pair();
    expect((await mcpPost(origin, p.access, LIST)).status).toBe(200);
    const r = await revoke({ token: p.access, token_type_hint: "access_token", client_id: p.clientId });
    expect(r.status).toBe(200);
    const after = await mcpPost(origin, p.access, LIST);
    expect(after.status).toBe(401);
    expect(after.wwwAuthenticate).toContain('error="invalid_token"');
    // Revoking one access token does not end the grant: the refresh token still rotates.
    const next = await refreshWith(p.clientId, p.refresh);
    expect(next.status).toBe(200);
    expect((await mcpPost(origin, String(next.body.access_token), LIST)).status).toBe(200);
  });

  it("a revoked refresh token takes its family with it: its access token and the refresh stop at the next request", async () => {
    const p = await pair();
    expect((await mcpPost(origin, p.access, LIST)).status).toBe(200);
    const r = await revoke({ token: p.refresh, token_type_hint: "refresh_token", client_id: p.clientId });
    expect(r.status).toBe(200);
    expect((await mcpPost(origin, p.access, LIST)).status).toBe(401);
    const again = await refreshWith(p.clientId, p.refresh);
    expect(again.status).toBe(400);
    expect(again.body.error).toBe("invalid_grant");
    const { stdout } = await cli("oauth", "grants", "list", "--client", p.clientId, "--json");
    const grants = JSON.parse(stdout) as Array<{ revoked_reason: string | null }>;
    expect(grants.map((g) => g.revoked_reason)).toEqual(["refresh_token_revoked"]);
  });

  it("an unknown token answers 200 (RFC 7009 §2.2) and revokes nothing", async () => {
    const p = await pair();
    for (const token of [`wcoa_${randomBytes(32).toString("base64url")}`, "not-a-token-at-all"]) {
      const r = await revoke({ token, client_id: p.clientId });
      expect(r.status).toBe(200);
    }
    expect((await mcpPost(origin, p.access, LIST)).status).toBe(200);
  });

  it("a client cannot revoke another client's tokens: 200, and they keep working", async () => {
    const victim = await pair();
    const other = await register();
    for (const token of [victim.access, victim.refresh]) {
      const r = await revoke({ token, client_id: other });
      expect(r.status).toBe(200);
    }
    expect((await mcpPost(origin, victim.access, LIST)).status).toBe(200);
    const next = await refreshWith(victim.clientId, victim.refresh);
    expect(next.status).toBe(200);
  });
});

describe("oauth_audit rows", () => {
  interface AuditRow {
    event: string;
    client_id: string | null;
    grant_id: string | null;
    scopes: string | null;
    detail: string | null;
  }

  async function auditList(limit: number): Promise<AuditRow[]> {
    const { stdout } = await cli("oauth", "audit", "list", "--limit", String(limit), "--json");
    return JSON.parse(stdout) as AuditRow[];
  }

  it("provisioning, unprovisioning and a grant revocation each write a row, and no token, code or key is in the table", async () => {
    const clientId = await register();
    await cli("oauth", "clients", "allow-coding-agent-run", clientId);
    const p = await exchange(await codeFor({ clientId, codingAgentRun: true }));
    expect(p.status).toBe(200);
    canaries.add(String(p.body.access_token));
    canaries.add(String(p.body.refresh_token));
    await cli("oauth", "clients", "disallow-coding-agent-run", clientId);
    const { stdout } = await cli("oauth", "grants", "list", "--client", clientId, "--json");
    const [grant] = JSON.parse(stdout) as Array<{ grant_id: string }>;
    await cli("oauth", "grants", "revoke", "--id", grant?.grant_id ?? "");
    // A token revocation and a refresh-family revocation by the client write rows too.
    const revoked = await pair();
    expect((await revoke({ token: revoked.access, client_id: revoked.clientId })).status).toBe(200);
    expect((await revoke({ token: revoked.refresh, client_id: revoked.clientId })).status).toBe(200);
    // A wrong key typed on the consent page and a token-endpoint request carrying secrets are canaries too.
    const wrongKey = `wct_${randomBytes(32).toString("base64url")}`;
    canaries.add(wrongKey);
    const c = await codeFor();
    await tokenRequest(origin, {
      grant_type: "authorization_code",
      client_id: c.clientId,
      code: c.code,
      code_verifier: wrongKey,
    });

    const mine = (await auditList(1000)).filter((r) => r.client_id === clientId);
    expect(mine.map((r) => r.event)).toEqual([
      "client_registered",
      "client_provisioned",
      "grant",
      "client_unprovisioned",
      "grant_revoked",
    ]);
    expect(mine[1]).toMatchObject({ scopes: "coding_agent:run" });
    expect(mine[2]).toMatchObject({ grant_id: grant?.grant_id, scopes: "project:read project:write coding_agent:run" });
    expect(mine[3]).toMatchObject({ scopes: "coding_agent:run" });
    expect(mine[4]).toMatchObject({ grant_id: grant?.grant_id, detail: "operator" });

    // The whole table, every column, straight from the state DB the Server writes.
    {
      const dump = JSON.stringify(await stack.stateRows("SELECT * FROM oauth_audit"));
      expect(dump).toContain('"token_revoked"');
      expect(dump).toContain('"refresh_token_revoked"');
      // At least: the run key, a wrong key, three codes and two token pairs of this test.
      expect(canaries.size).toBeGreaterThanOrEqual(9);
      for (const secret of canaries) expect(dump).not.toContain(secret);
      // No token or code of any kind: a prefix at the start of a value (inside a random id it is chance).
      expect(dump).not.toMatch(/(?<![\w-])(wcoa|wcor|wcoc|wct)_/);
    }
  });

  it("oauth audit list prints at most --limit rows, newest last, and refuses a bad --limit", async () => {
    const all = await auditList(1000);
    const two = await auditList(2);
    expect(two).toEqual(all.slice(-2));
    const text = await cli("oauth", "audit", "list", "--limit", "1");
    expect(text.stdout.trim().split("\n")).toHaveLength(1);
    for (const bad of ["0", "abc", "1.5", "10001"]) {
      await expect(cli("oauth", "audit", "list", "--limit", bad)).rejects.toMatchObject({
        code: 2,
        stderr: expect.stringContaining("--limit must be a whole number from 1 to 10000"),
      });
    }
  });
});

describe("token endpoint errors", () => {
  it("a malformed token request keeps its OAuth error code and gets a fixed description, never input or library text", async () => {
    const clientId = await register();
    const canary = `CANARY_${randomBytes(8).toString("hex")}`;
    const cases: Array<{ form: Record<string, string>; error: string }> = [
      { form: { client_id: clientId }, error: "invalid_request" },
      { form: { grant_type: canary, client_id: clientId }, error: "unsupported_grant_type" },
      {
        form: { grant_type: "authorization_code", client_id: clientId, code_verifier: canary },
        error: "invalid_request",
      },
      { form: { grant_type: "refresh_token", client_id: clientId, scope: canary }, error: "invalid_request" },
      { form: { grant_type: "authorization_code", code: canary }, error: "invalid_request" },
      {
        form: { grant_type: "authorization_code", client_id: canary, code: "x", code_verifier: "y" },
        error: "invalid_client",
      },
    ];
    for (const { form, error } of cases) {
      const r = await tokenRequest(origin, form);
      expect(r.status, JSON.stringify(form)).toBe(400);
      expect(r.body.error).toBe(error);
      expect(r.body.error_description).toBe(FIXED_ERROR_DESCRIPTIONS[error]);
      expect(JSON.stringify(r.body)).not.toContain(canary);
    }
    // Our own fixed descriptions still come through (they name the reason, never the input).
    const c = await codeFor({ clientId });
    const wrong = await tokenRequest(origin, {
      grant_type: "authorization_code",
      client_id: clientId,
      code: `wcoc_${canary}`,
      code_verifier: c.verifier,
    });
    expect(wrong.body).toEqual({
      error: "invalid_grant",
      error_description: "unknown, expired or already used authorization code",
    });
    const noToken = await revoke({ client_id: clientId, token_type_hint: canary });
    expect(noToken.status).toBe(400);
    expect(JSON.parse(noToken.body)).toEqual({
      error: "invalid_request",
      error_description: FIXED_ERROR_DESCRIPTIONS.invalid_request,
    });
  });
});

describe("lifetimes (restart with the test-only OAuth clock skew)", () => {
  it("an expired access token gets 401 with WWW-Authenticate error=invalid_token, and a code older than 60 s is refused", async () => {
    const p = await pair();
    const pending = await codeFor();
    expect((await mcpPost(origin, p.access, LIST)).status).toBe(200);
    const skewMs = Math.max(ACCESS_TTL_SECS * 1000, CODE_TTL_MS) + 1000;

    await stack.killServer("SIGTERM");
    stack.opts.serverEnv = { [OAUTH_TEST_CLOCK_ENV]: String(skewMs) };
    await stack.startServer();

    const expired = await mcpPost(origin, p.access, LIST);
    expect(expired.status).toBe(401);
    expect(expired.wwwAuthenticate).toMatch(/^Bearer /);
    expect(expired.wwwAuthenticate).toContain('error="invalid_token"');
    expect(expired.wwwAuthenticate).toContain(`resource_metadata="${origin}/.well-known/oauth-protected-resource/mcp"`);

    const late = await exchange(pending);
    expect(late.status).toBe(400);
    expect(late.body).toEqual({ error: "invalid_grant", error_description: "the authorization code expired" });

    // The Server itself is fine: the refresh token (1 h at least) still rotates into a working access token,
    // and a code issued under the skewed clock redeems.
    const next = await refreshWith(p.clientId, p.refresh);
    expect(next.status).toBe(200);
    expect((await mcpPost(origin, String(next.body.access_token), LIST)).status).toBe(200);
    expect((await exchange(await codeFor())).status).toBe(200);
  });
});
