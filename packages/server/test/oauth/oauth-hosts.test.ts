/**
 * Issue 28 §1: the protocol details real hosts (ChatGPT, Claude.ai, 2026-07-28 clients) depend on,
 * each as a negative and a positive case, against an in-process Server over raw HTTP:
 * RFC 9207 `iss` on every authorization response, `resource` normalization, unknown scope names,
 * the refresh-token reuse grace window, SEP-837 `application_type`, `dynamic_registration = false`,
 * issuer-bound client credentials (SEP-2352), `trusted_proxies` and `cors_origins`. The Server keeps its
 * state on the pass's engine (support/test-state.ts): SQLite in the main pass, PostgreSQL in the PostgreSQL pass.
 */
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import type { IncomingMessage } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { clientAddressResolver } from "../../src/client-address.js";
import { buildServerConfig } from "../../src/config.js";
import { CORS_ALLOW_HEADERS, CORS_EXPOSE_HEADERS } from "../../src/mcp/gate.js";
import { MAX_PENDING_PER_ADDRESS, MAX_PENDING_PER_CLIENT } from "../../src/oauth/consent.js";
import { OAuthStore, sha256 } from "../../src/oauth/store.js";
import { TokenStore } from "../../src/principals/tokens.js";
import { type RunningServer, startServer } from "../../src/server.js";
import { answerConsent, created, mcpPost, openConsent, tokenRequest } from "../support/oauth.js";
import { TEST_STATE_DIALECT, type TestServerState, testServerState } from "../support/test-state.js";

const silent = pino({ level: "silent" });
const REDIRECT = "https://app.example/callback";
const ALL = ["coding_agent:run", "project:write", "project:read", "runtime:read", "runtime:write"];

interface Running {
  server: RunningServer;
  /** Where requests go (the listening socket). */
  origin: string;
  /** `public_url`: the issuer, and `${issuer}/mcp` the resource. */
  issuer: string;
  key(scopes: string[]): Promise<string>;
  stateDir: string;
}

const dirs: string[] = [];
/** Where the Server of each dir keeps its state, so that a Server started again on a dir finds it. */
const states = new Map<string, TestServerState>();
const running: RunningServer[] = [];
afterEach(async () => {
  for (const s of running.splice(0)) await s.close();
});
afterAll(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** A Server with OAuth on; `issuer` is its public_url (it need not be where it listens). */
async function start(
  opts: { oauth?: Record<string, unknown>; server?: Record<string, unknown>; issuer?: string; dir?: string } = {},
): Promise<Running> {
  const dir =
    opts.dir ??
    (() => {
      const d = mkdtempSync(join(tmpdir(), "wc-oauth-hosts-"));
      dirs.push(d);
      return d;
    })();
  const issuer = opts.issuer ?? "http://127.0.0.1:1";
  const state = states.get(dir) ?? (await testServerState());
  states.set(dir, state);
  const config = buildServerConfig(
    {
      server: { host: "127.0.0.1", port: 0, state_dir: "state", public_url: issuer, ...state.server, ...opts.server },
      oauth: { enabled: true, ...opts.oauth },
      principals: [{ id: "alice", scopes: ALL, projects: ["demo"] }],
    },
    { file: null, baseDir: dir },
  );
  const server = await startServer({ config, logger: silent, mcp: true, env: { ...state.env } });
  running.push(server);
  if (server.store.engine.dialect !== TEST_STATE_DIALECT) {
    throw new Error(`the Server keeps its state on ${server.store.engine.dialect}, not on this pass's engine`);
  }
  const tokens = new TokenStore(server.store.engine);
  return {
    server,
    origin: server.url,
    issuer,
    stateDir: config.stateDir,
    key: async (scopes) =>
      (
        await tokens.issue(
          {
            principal_id: "alice",
            scopes: scopes as never,
            projects: ["demo"],
            allowCodingAgentRun: scopes.includes("coding_agent:run"),
          },
          (id) => config.principals.find((p) => p.id === id),
        )
      ).token,
  };
}

async function register(origin: string, body: Record<string, unknown> = {}) {
  const res = await fetch(`${origin}/register`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      client_name: "Host",
      redirect_uris: [REDIRECT],
      token_endpoint_auth_method: "none",
      ...body,
    }),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

async function clientOf(origin: string): Promise<string> {
  const r = await register(origin);
  expect(r.status).toBe(201);
  return String(r.body.client_id);
}

function pkce() {
  const verifier = randomBytes(32).toString("base64url");
  return { verifier, challenge: createHash("sha256").update(verifier).digest("base64url") };
}

function authorizeUrl(s: Running, clientId: string, challenge: string, over: Record<string, string | null> = {}) {
  const params: Record<string, string | null> = {
    response_type: "code",
    client_id: clientId,
    redirect_uri: REDIRECT,
    code_challenge: challenge,
    code_challenge_method: "S256",
    scope: "project:read project:write",
    state: "st",
    resource: `${s.issuer}/mcp`,
    ...over,
  };
  const u = new URL(`${s.origin}/authorize`);
  for (const [k, v] of Object.entries(params)) if (v !== null) u.searchParams.set(k, v);
  return u.href;
}

async function redirectOf(url: string): Promise<URL> {
  const res = await fetch(url, { redirect: "manual" });
  expect(res.status).toBe(302);
  return new URL(res.headers.get("location") ?? "");
}

/** Consent with `key` and exchange the code; the token response body. */
async function tokensFor(s: Running, key: string, over: Record<string, string | null> = {}) {
  const clientId = await clientOf(s.origin);
  const { verifier, challenge } = pkce();
  const page = await openConsent(authorizeUrl(s, clientId, challenge, over));
  expect(page.status).toBe(200);
  const answered = await answerConsent(s.origin, page, { action: "approve", key });
  const code = answered.location?.searchParams.get("code") ?? "";
  const t = await tokenRequest(s.origin, {
    grant_type: "authorization_code",
    client_id: clientId,
    code,
    code_verifier: verifier,
    redirect_uri: REDIRECT,
  });
  expect(t.status).toBe(200);
  return { clientId, body: t.body };
}

describe("RFC 9207: iss on every authorization response", () => {
  it("error redirects (access_denied, invalid_scope, invalid_target, invalid_request) carry iss, like the code", async () => {
    const s = await start();
    const clientId = await clientOf(s.origin);
    const runOnlyless = await s.key(["project:read"]);
    // A person allowed this client once: its redirect is confirmed, so /authorize errors go back to it.
    const ok = await openConsent(authorizeUrl(s, clientId, pkce().challenge));
    const approved = await answerConsent(s.origin, ok, { action: "approve", key: runOnlyless });
    expect(approved.location?.searchParams.get("code")).toBeTruthy();
    expect(approved.location?.searchParams.get("iss")).toBe(s.issuer);

    const deny = await openConsent(authorizeUrl(s, clientId, pkce().challenge));
    const denied = await answerConsent(s.origin, deny, { action: "deny" });
    expect(denied.location?.searchParams.get("error")).toBe("access_denied");
    expect(denied.location?.searchParams.get("iss")).toBe(s.issuer);

    // Only coding_agent:run asked for, and the key lacks it: nothing grantable.
    const scopePage = await openConsent(authorizeUrl(s, clientId, pkce().challenge, { scope: "coding_agent:run" }));
    const noScope = await answerConsent(s.origin, scopePage, { action: "approve", key: runOnlyless });
    expect(noScope.location?.searchParams.get("error")).toBe("invalid_scope");
    expect(noScope.location?.searchParams.get("iss")).toBe(s.issuer);

    const target = await redirectOf(
      authorizeUrl(s, clientId, pkce().challenge, { resource: "https://other.example/mcp" }),
    );
    expect(target.searchParams.get("error")).toBe("invalid_target");
    expect(target.searchParams.get("iss")).toBe(s.issuer);
    expect(target.searchParams.get("state")).toBe("st");

    const malformed = await redirectOf(authorizeUrl(s, clientId, "", { code_challenge: null }));
    expect(malformed.searchParams.get("error")).toBe("invalid_request");
    expect(malformed.searchParams.get("iss")).toBe(s.issuer);
    // The SDK's validation-library text is replaced by a fixed description.
    expect(malformed.searchParams.get("error_description")).not.toMatch(/code_challenge|expected|invalid_type/i);
  });

  it("a client no person has allowed yet gets /authorize errors as a page, never a redirect to its address", async () => {
    const s = await start();
    const fresh = await clientOf(s.origin);
    for (const over of [{ resource: "https://other.example/mcp" }, { code_challenge: null }]) {
      const res = await fetch(authorizeUrl(s, fresh, pkce().challenge, over), { redirect: "manual" });
      expect(res.status).toBe(400);
      expect(res.headers.get("location")).toBeNull();
      expect(await res.text()).toMatch(/invalid_target|invalid_request/);
    }
    // An operator-registered client's redirect is the operator's: errors go back to it.
    const ops = await start({
      oauth: { clients: [{ client_id: "ops-ide", name: "Ops IDE", redirect_uris: [REDIRECT] }] },
    });
    const back = await redirectOf(
      authorizeUrl(ops, "ops-ide", pkce().challenge, { resource: "https://x.example/mcp" }),
    );
    expect(back.searchParams.get("error")).toBe("invalid_target");
  });
});

describe("resource (RFC 8707) normalization", () => {
  it("omitted means this Server's /mcp; case of scheme/host, a default port and a trailing slash do not matter", async () => {
    const s = await start({ issuer: "https://mcp.example.com" });
    const key = await s.key(["project:read"]);
    const omitted = await tokensFor(s, key, { resource: null });
    expect((await mcpPost(s.origin, String(omitted.body.access_token), { method: "tools/list" })).status).toBe(200);
    for (const resource of ["HTTPS://MCP.Example.COM/mcp/", "https://mcp.example.com:443/mcp"]) {
      const t = await tokensFor(s, key, { resource });
      expect((await mcpPost(s.origin, String(t.body.access_token), { method: "tools/list" })).status).toBe(200);
    }
    const clientId = await clientOf(s.origin);
    const page = await openConsent(
      authorizeUrl(s, clientId, pkce().challenge, { resource: "https://mcp.example.com/mcp/" }),
    );
    expect(page.status).toBe(200);
  });

  it("a genuinely different resource is invalid_target, at /authorize and at /token", async () => {
    const s = await start({ issuer: "https://mcp.example.com" });
    const clientId = await clientOf(s.origin);
    const key = await s.key(["project:read"]);
    const { verifier, challenge } = pkce();
    const page = await openConsent(authorizeUrl(s, clientId, challenge));
    const code = (await answerConsent(s.origin, page, { action: "approve", key })).location?.searchParams.get("code");
    for (const resource of [
      "https://other.example.com/mcp",
      "https://mcp.example.com:8443/mcp",
      "http://mcp.example.com/mcp",
      "https://mcp.example.com/mcp/x",
      "https://mcp.example.com/MCP",
      "https://mcp.example.com/mcp?tenant=1",
      "https://mcp.example.com/",
    ]) {
      const u = await redirectOf(authorizeUrl(s, clientId, pkce().challenge, { resource }));
      expect(u.searchParams.get("error"), resource).toBe("invalid_target");
    }
    const t = await tokenRequest(s.origin, {
      grant_type: "authorization_code",
      client_id: clientId,
      code: code ?? "",
      code_verifier: verifier,
      redirect_uri: REDIRECT,
      resource: "https://other.example.com/mcp",
    });
    expect(t.body.error).toBe("invalid_target");
  });
});

describe("scopes hosts send", () => {
  it("unknown scope names are ignored: none known asks for the default set, some known asks for those", async () => {
    const s = await start();
    const key = await s.key(["project:read", "project:write"]);
    const clientId = await clientOf(s.origin);
    const onlyHost = await openConsent(authorizeUrl(s, clientId, pkce().challenge, { scope: "claudeai" }));
    expect(onlyHost.status).toBe(200);
    expect(onlyHost.html).toContain("project:read");
    expect(onlyHost.html).not.toContain("claudeai");
    const t = await tokensFor(s, key, { scope: "claudeai" });
    expect(String(t.body.scope).split(" ").sort()).toEqual(["project:read", "project:write"]);

    const mixed = await tokensFor(s, key, { scope: "claudeai project:read offline_access" });
    expect(t.body.scope).not.toBe(mixed.body.scope);
    expect(mixed.body.scope).toBe("project:read");
  });
});

describe("the consent page says exactly what is granted (issue 28 §2)", () => {
  it("the review before Allow and the result after it list only what the key grants, its projects and how long", async () => {
    const s = await start({ oauth: { refresh_token_ttl_secs: 14 * 86_400, access_token_ttl_secs: 1800 } });
    const clientId = await clientOf(s.origin);
    const key = await s.key(["project:read", "runtime:read"]);
    const page = await openConsent(
      authorizeUrl(s, clientId, pkce().challenge, {
        scope: "project:read project:write runtime:read coding_agent:run",
      }),
    );
    // Before the key is known, the page shows what the app asks for.
    expect(page.html).toContain("Make changes in your projects");
    const answered = await answerConsent(s.origin, page, { action: "approve", key });
    const review = answered.review ?? "";
    for (const html of [review, answered.html]) {
      expect(html).toContain("See which of your projects it can use");
      expect(html).toContain("Read your work sessions");
      expect(html).not.toContain("Make changes in your projects");
      expect(html).toContain("<code>demo</code>");
      expect(html).toContain("14 days");
      expect(html).toContain("30 minutes");
      // Asked for, not provisioned: the person can forward the exact command.
      expect(html).toContain(`allow-coding-agent-run ${clientId} --config`);
    }
    expect(answered.html).toContain("is connected");
    expect(answered.location?.searchParams.get("iss")).toBe(s.issuer);
    expect(answered.html).toMatch(/<meta http-equiv="refresh" content="\d+;url=/);
  });

  it("a key revoked between the review and Allow grants nothing: the page asks for a key again", async () => {
    const s = await start();
    const clientId = await clientOf(s.origin);
    const key = await s.key(["project:read"]);
    const page = await openConsent(authorizeUrl(s, clientId, pkce().challenge));
    const post = (fields: Record<string, string>) =>
      fetch(`${s.origin}/oauth/consent`, {
        method: "POST",
        redirect: "manual",
        headers: { "content-type": "application/x-www-form-urlencoded", cookie: page.cookie },
        body: new URLSearchParams({ request_id: page.requestId, csrf: page.csrf, ...fields }),
      });
    expect((await post({ action: "review", key })).status).toBe(200);
    const tokens = new TokenStore(s.server.store.engine);
    for (const row of await s.server.store.engine.all<{ token_id: string }>("SELECT token_id FROM principal_tokens")) {
      await tokens.revoke(row.token_id);
    }
    const allow = await post({ action: "approve" });
    expect(allow.status).toBe(401);
    expect(allow.headers.get("location")).toBeNull();
    expect(await allow.text()).toContain("no longer works");
    // Allow without a review or a key is a wrong key, not a grant.
    const bare = await post({ action: "approve" });
    expect(bare.status).toBe(401);
  });
});

describe("refresh token reuse grace window", () => {
  it("a refresh token presented again within the window gets the same new pair; the family lives on", async () => {
    const s = await start();
    const { clientId, body } = await tokensFor(s, await s.key(["project:read"]));
    const refresh = (token: string) =>
      tokenRequest(s.origin, { grant_type: "refresh_token", refresh_token: token, client_id: clientId });
    const first = await refresh(String(body.refresh_token));
    expect(first.status).toBe(200);
    const retried = await refresh(String(body.refresh_token));
    expect(retried.status).toBe(200);
    expect(retried.body.access_token).toBe(first.body.access_token);
    expect(retried.body.refresh_token).toBe(first.body.refresh_token);
    expect((await mcpPost(s.origin, String(first.body.access_token), { method: "tools/list" })).status).toBe(200);
    // The successor is kept only encrypted: no stored column holds the new tokens.
    const stored = await s.server.store.engine.all<{ token_hash: string; successor: Buffer | null }>(
      "SELECT token_hash, successor FROM oauth_tokens",
    );
    const rows = JSON.stringify(stored.map((r) => ({ ...r, successor: r.successor?.toString("hex") ?? null })));
    for (const t of [first.body.access_token, first.body.refresh_token]) {
      expect(rows).not.toContain(String(t));
      expect(rows.toLowerCase()).not.toContain(Buffer.from(String(t)).toString("hex"));
    }
    const events = (await new OAuthStore(s.server.store.engine).auditRows()).map((r) => r.event);
    expect(events).toContain("refresh_replayed");
    expect(events).not.toContain("refresh_reused");

    // Once the successor itself rotated, the old token is stale: reuse revokes the family.
    const second = await refresh(String(first.body.refresh_token));
    expect(second.status).toBe(200);
    const stale = await refresh(String(body.refresh_token));
    expect(stale.body.error).toBe("invalid_grant");
    expect((await mcpPost(s.origin, String(second.body.access_token), { method: "tools/list" })).status).toBe(401);
  });

  it("outside the window, reuse revokes the family and is audited (store clock)", async () => {
    const s = await start();
    let now = Date.now();
    const store = new OAuthStore(s.server.store.engine, () => now);
    await store.upsertClient({ client_id: "c1", kind: "dynamic", client_name: null, redirect_uris: [REDIRECT] });
    const { code } = await created(
      store.createGrantWithCode(
        {
          client_id: "c1",
          principal_id: "alice",
          key_id: null,
          scopes: ["project:read"],
          projects: [],
          resource: "r",
        },
        { redirect_uri: REDIRECT, code_challenge: "x" },
      ),
    );
    const ttl = { accessMs: 3_600_000, refreshMs: 86_400_000, reuseGraceMs: 30_000 };
    const r0 = await store.redeemCode(code, "c1", REDIRECT, ttl);
    if (!r0.ok) throw new Error(r0.reason);
    const r1 = await store.rotateRefresh(r0.pair.refresh_token, "c1", undefined, ttl);
    if (!r1.ok) throw new Error(r1.reason);
    now += 29_000;
    const within = await store.rotateRefresh(r0.pair.refresh_token, "c1", undefined, ttl);
    expect(within).toMatchObject({ ok: true, replayed: true, pair: { refresh_token: r1.pair.refresh_token } });
    now += 2_000;
    const after = await store.rotateRefresh(r0.pair.refresh_token, "c1", undefined, ttl);
    expect(after).toEqual({ ok: false, reason: "reused" });
    expect((await store.grant(r1.grant.grant_id))?.revoked_reason).toBe("refresh_reused");
    expect((await store.auditRows()).map((r) => r.event)).toContain("refresh_reused");
    // With the grace off, the first reuse already revokes.
    const g2 = await created(
      store.createGrantWithCode(
        { client_id: "c1", principal_id: "alice", key_id: null, scopes: ["project:read"], projects: [], resource: "r" },
        { redirect_uri: REDIRECT, code_challenge: "x" },
      ),
    );
    const off = { ...ttl, reuseGraceMs: 0 };
    const p0 = await store.redeemCode(g2.code, "c1", REDIRECT, off);
    if (!p0.ok) throw new Error(p0.reason);
    expect((await store.rotateRefresh(p0.pair.refresh_token, "c1", undefined, off)).ok).toBe(true);
    expect(await store.rotateRefresh(p0.pair.refresh_token, "c1", undefined, off)).toEqual({
      ok: false,
      reason: "reused",
    });
    // Erased once the window has passed: the next rotation anywhere clears the spent row's successor.
    const fresh = async () => {
      const g = await created(
        store.createGrantWithCode(
          {
            client_id: "c1",
            principal_id: "alice",
            key_id: null,
            scopes: ["project:read"],
            projects: [],
            resource: "r",
          },
          { redirect_uri: REDIRECT, code_challenge: "x" },
        ),
      );
      const r = await store.redeemCode(g.code, "c1", REDIRECT, ttl);
      if (!r.ok) throw new Error(r.reason);
      return r.pair.refresh_token;
    };
    const spent = await fresh();
    expect((await store.rotateRefresh(spent, "c1", undefined, ttl)).ok).toBe(true);
    const successor = async () =>
      (
        await s.server.store.engine.get<{ successor: Buffer | null }>(
          "SELECT successor FROM oauth_tokens WHERE token_hash = ?",
          [sha256(spent)],
        )
      )?.successor;
    expect(await successor()).toBeInstanceOf(Buffer);
    now += 31_000;
    expect((await store.rotateRefresh(await fresh(), "c1", undefined, ttl)).ok).toBe(true);
    expect(await successor()).toBeNull();
  });
});

describe("SEP-837 application_type at dynamic registration", () => {
  it("native clients may use loopback http on any port; web clients need https; other values are refused", async () => {
    const s = await start();
    const nativeOk = await register(s.origin, {
      application_type: "native",
      redirect_uris: ["http://127.0.0.1/cb", "http://localhost/cb", "http://[::1]/cb", "com.example.app:/cb"],
    });
    expect(nativeOk.status).toBe(201);
    const page = await openConsent(
      authorizeUrl(s, String(nativeOk.body.client_id), pkce().challenge, {
        redirect_uri: "http://127.0.0.1:49152/cb",
      }),
    );
    expect(page.status).toBe(200);
    const nativeBad = await register(s.origin, {
      application_type: "native",
      redirect_uris: ["http://app.example/cb"],
    });
    expect(nativeBad.status).toBe(400);
    expect(nativeBad.body.error).toBe("invalid_redirect_uri");

    expect((await register(s.origin, { application_type: "web" })).status).toBe(201);
    const webLoopback = await register(s.origin, {
      application_type: "web",
      redirect_uris: ["http://127.0.0.1:3000/cb"],
    });
    expect(webLoopback.status).toBe(400);
    expect(webLoopback.body).toEqual({
      error: "invalid_redirect_uri",
      error_description: "redirect_uris of a web client (application_type web) must be https",
    });
    const odd = await register(s.origin, { application_type: "desktop" });
    expect(odd.status).toBe(400);
    expect(odd.body.error).toBe("invalid_client_metadata");
  });

  it("redirect schemes: https, loopback http, reverse-domain private-use schemes and the allowed app schemes; nothing else", async () => {
    const s = await start();
    for (const uri of [
      "ftp://files.example/cb",
      "ws://127.0.0.1/cb",
      "ms-msdt:/id",
      "view-source:https://x.example/",
    ]) {
      const refused = await register(s.origin, { application_type: "native", redirect_uris: [uri] });
      expect(refused.status, uri).toBe(400);
      expect(refused.body.error, uri).toBe("invalid_redirect_uri");
      expect(String(refused.body.error_description), uri).toContain("is not allowed");
    }
    // Cursor registers its own single-label scheme beside the loopback one; it is in the default allow list.
    const cursor = await register(s.origin, {
      application_type: "native",
      redirect_uris: ["cursor://anysphere.cursor-mcp/oauth/callback", "com.example.app:/cb"],
    });
    expect(cursor.status).toBe(201);

    const strict = await start({ oauth: { app_redirect_schemes: [] } });
    const noCursor = await register(strict.origin, {
      application_type: "native",
      redirect_uris: ["cursor://anysphere.cursor-mcp/oauth/callback"],
    });
    expect(noCursor.status).toBe(400);
    expect(String(noCursor.body.error_description)).toContain("app_redirect_schemes");
  });
});

describe("client registration: metadata documents preferred, DCR switchable, credentials bound to the issuer", () => {
  it("dynamic_registration = false drops /register and its metadata entry; metadata documents stay advertised", async () => {
    const on = await start();
    const onMeta = (await (await fetch(`${on.origin}/.well-known/oauth-authorization-server`)).json()) as Record<
      string,
      unknown
    >;
    expect(onMeta.registration_endpoint).toBe(`${on.issuer}/register`);
    expect(onMeta.client_id_metadata_document_supported).toBe(true);

    const off = await start({ oauth: { dynamic_registration: false } });
    const offMeta = (await (await fetch(`${off.origin}/.well-known/oauth-authorization-server`)).json()) as Record<
      string,
      unknown
    >;
    expect(offMeta.registration_endpoint).toBeUndefined();
    expect(offMeta.client_id_metadata_document_supported).toBe(true);
    const r = await register(off.origin);
    expect(r.status).toBe(404);
    expect(String(r.body.error_description)).toMatch(/client ID metadata document/);
  });

  it("a dynamic client registered under one issuer is refused once the Server's issuer is another", async () => {
    const dir = mkdtempSync(join(tmpdir(), "wc-oauth-hosts-"));
    dirs.push(dir);
    const a = await start({ dir, issuer: "https://a.example.com" });
    const clientId = await clientOf(a.origin);
    expect((await openConsent(authorizeUrl(a, clientId, pkce().challenge))).status).toBe(200);
    await a.server.close();
    running.splice(running.indexOf(a.server), 1);

    const b = await start({ dir, issuer: "https://b.example.com" });
    const refused = await fetch(authorizeUrl(b, clientId, pkce().challenge), { redirect: "manual" });
    expect(refused.status).toBe(400);
    expect(refused.headers.get("location")).toBeNull();
    expect(await refused.text()).toContain("registered with another issuer");
    const token = await tokenRequest(b.origin, {
      grant_type: "refresh_token",
      refresh_token: "wcor_x",
      client_id: clientId,
    });
    expect(token.body.error).toBe("invalid_client");
    // A client registered under b works under b.
    const fresh = await clientOf(b.origin);
    expect((await openConsent(authorizeUrl(b, fresh, pkce().challenge))).status).toBe(200);
  });
});

describe("[server] trusted_proxies", () => {
  function req(remote: string, headers: Record<string, string>): IncomingMessage {
    return { socket: { remoteAddress: remote }, headers } as unknown as IncomingMessage;
  }

  it("believes X-Forwarded-For / Forwarded only from trusted proxies, walking the hops from the socket", () => {
    const none = clientAddressResolver([]);
    expect(none(req("10.0.0.2", { "x-forwarded-for": "203.0.113.9" }))).toBe("10.0.0.2");
    const trust = clientAddressResolver(["10.0.0.0/8", "::1"]);
    expect(trust(req("10.0.0.2", { "x-forwarded-for": "203.0.113.9" }))).toBe("203.0.113.9");
    expect(trust(req("::ffff:10.0.0.2", { "x-forwarded-for": "198.51.100.1, 203.0.113.9, 10.1.1.1" }))).toBe(
      "203.0.113.9",
    );
    // From an untrusted peer the header is the client's own claim.
    expect(trust(req("192.0.2.7", { "x-forwarded-for": "203.0.113.9" }))).toBe("192.0.2.7");
    expect(trust(req("::1", { forwarded: 'for=192.0.2.60;proto=https, for="[2001:db8::17]:4711"' }))).toBe(
      "2001:db8::17",
    );
    expect(trust(req("10.0.0.2", { forwarded: "for=unknown" }))).toBe("10.0.0.2");
    expect(trust(req("10.0.0.2", { "x-forwarded-for": "not-an-ip" }))).toBe("10.0.0.2");
  });

  it("the key-attempt bound counts per forwarded client behind a trusted proxy, and per socket without one", async () => {
    const canary = `wct_${randomBytes(24).toString("base64url")}`;
    const attempt = async (s: Running, clientId: string, forwardedFor: string) => {
      const page = await openConsent(authorizeUrl(s, clientId, pkce().challenge));
      const form = new URLSearchParams({ request_id: page.requestId, csrf: page.csrf, action: "approve", key: canary });
      const res = await fetch(`${s.origin}/oauth/consent`, {
        method: "POST",
        redirect: "manual",
        headers: {
          "content-type": "application/x-www-form-urlencoded",
          cookie: page.cookie,
          "x-forwarded-for": forwardedFor,
        },
        body: form,
      });
      return res.status;
    };
    const proxied = await start({ server: { trusted_proxies: ["127.0.0.1"] }, oauth: { max_key_attempts: 2 } });
    const c1 = await clientOf(proxied.origin);
    expect(await attempt(proxied, c1, "203.0.113.5")).toBe(401);
    expect(await attempt(proxied, c1, "203.0.113.5")).toBe(401);
    expect(await attempt(proxied, c1, "203.0.113.5")).toBe(429);
    expect(await attempt(proxied, c1, "203.0.113.6")).toBe(401);

    const direct = await start({ oauth: { max_key_attempts: 2 } });
    const c2 = await clientOf(direct.origin);
    expect(await attempt(direct, c2, "203.0.113.5")).toBe(401);
    expect(await attempt(direct, c2, "203.0.113.6")).toBe(401);
    expect(await attempt(direct, c2, "203.0.113.7")).toBe(429);
  });
});

describe("open consent pages are bounded per client and per address", () => {
  it("a flood from some addresses is refused instead of evicting the page a person has open", async () => {
    const s = await start({ server: { trusted_proxies: ["127.0.0.1"] } });
    const victim = await clientOf(s.origin);
    const person = await openConsent(authorizeUrl(s, victim, pkce().challenge));
    expect(person.status).toBe(200);
    const flood = async (clientId: string, from: string) =>
      (
        await fetch(authorizeUrl(s, clientId, pkce().challenge), {
          redirect: "manual",
          headers: { "x-forwarded-for": from },
        })
      ).status;
    // One address: MAX_PENDING_PER_ADDRESS pages, then 429.
    for (let i = 0; i < MAX_PENDING_PER_ADDRESS; i++) expect(await flood(victim, "198.51.100.1")).toBe(200);
    expect(await flood(victim, "198.51.100.1")).toBe(429);
    // Many addresses, one client: MAX_PENDING_PER_CLIENT in all for that client, then 429 for it only.
    let open = 1 + MAX_PENDING_PER_ADDRESS;
    for (let n = 2; open < MAX_PENDING_PER_CLIENT; n++) {
      for (let i = 0; i < MAX_PENDING_PER_ADDRESS - 1 && open < MAX_PENDING_PER_CLIENT; i++, open++) {
        expect(await flood(victim, `198.51.100.${n}`)).toBe(200);
      }
    }
    expect(await flood(victim, "203.0.113.200")).toBe(429);
    const other = await clientOf(s.origin);
    expect(await flood(other, "203.0.113.200")).toBe(200);
    // The person's page still answers.
    const answered = await answerConsent(s.origin, person, { action: "approve", key: await s.key(["project:read"]) });
    expect(answered.location?.searchParams.get("code")).toBeTruthy();
  });
});

describe("[server] cors_origins for /mcp", () => {
  const INSPECTOR = "https://inspector.example";

  it("answers a configured origin's preflight without auth and exposes the headers clients read", async () => {
    const s = await start({ server: { cors_origins: [INSPECTOR] } });
    const pre = await fetch(`${s.origin}/mcp`, {
      method: "OPTIONS",
      headers: {
        origin: INSPECTOR,
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, mcp-protocol-version",
      },
    });
    expect(pre.status).toBe(204);
    expect(pre.headers.get("access-control-allow-origin")).toBe(INSPECTOR);
    expect(pre.headers.get("access-control-allow-headers")).toBe(CORS_ALLOW_HEADERS.join(", "));
    expect(pre.headers.get("access-control-allow-methods")).toContain("POST");
    const unauth = await fetch(`${s.origin}/mcp`, {
      method: "POST",
      headers: { origin: INSPECTOR, "content-type": "application/json", accept: "application/json, text/event-stream" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list" }),
    });
    expect(unauth.status).toBe(401);
    expect(unauth.headers.get("access-control-allow-origin")).toBe(INSPECTOR);
    expect(unauth.headers.get("access-control-expose-headers")).toBe(CORS_EXPOSE_HEADERS.join(", "));
    expect(unauth.headers.get("www-authenticate")).toContain("resource_metadata=");
    // Another origin gets no CORS headers, and its requests are still refused by the Origin check.
    const other = await fetch(`${s.origin}/mcp`, { method: "OPTIONS", headers: { origin: "https://evil.example" } });
    expect(other.headers.get("access-control-allow-origin")).toBeNull();
    expect(other.status).toBe(403);
  });

  it("with no cors_origins nothing changes: no CORS headers and the origin is refused", async () => {
    const s = await start();
    const pre = await fetch(`${s.origin}/mcp`, { method: "OPTIONS", headers: { origin: INSPECTOR } });
    expect(pre.status).toBe(403);
    expect(pre.headers.get("access-control-allow-origin")).toBeNull();
  });
});

describe("config", () => {
  const build = (server: Record<string, unknown>, oauth: Record<string, unknown> = {}) =>
    buildServerConfig(
      { server: { port: 0, public_url: "https://mcp.example.com", ...server }, oauth: { enabled: true, ...oauth } },
      { file: null, baseDir: tmpdir() },
    );

  it("validates the new keys with the field and what is allowed", () => {
    const cfg = build({ trusted_proxies: ["10.0.0.0/8", "fd00::1"], cors_origins: ["https://inspector.example"] });
    expect(cfg.trustedProxies).toEqual(["10.0.0.0/8", "fd00::1"]);
    expect(cfg.corsOrigins).toEqual(["https://inspector.example"]);
    expect(cfg.oauth).toMatchObject({ refreshReuseGraceSecs: 30, dynamicRegistration: true });
    expect(() => build({ trusted_proxies: ["10.0.0.0/33"] })).toThrow(
      /server\.trusted_proxies\.0: must be an IP address or CIDR block/,
    );
    expect(() => build({ trusted_proxies: ["proxy.example"] })).toThrow(/server\.trusted_proxies\.0/);
    expect(() => build({ cors_origins: ["https://inspector.example/"] })).toThrow(
      /server\.cors_origins\.0: must be an origin/,
    );
    expect(() => build({}, { refresh_reuse_grace_secs: -1 })).toThrow(/oauth\.refresh_reuse_grace_secs/);
    expect(() => build({}, { refresh_reuse_grace_secs: 301 })).toThrow(/oauth\.refresh_reuse_grace_secs/);
    expect(() => build({}, { dynamic_registration: "no" })).toThrow(/oauth\.dynamic_registration/);
  });
});
