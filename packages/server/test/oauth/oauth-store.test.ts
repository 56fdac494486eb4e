/**
 * OAuth store and wiring: audience binding, the bound on dynamic clients and what the audit rows hold, on
 * the pass's state engine (support/test-state.ts); and upgrade safety (a state database from before OAuth
 * opens, and nothing in it gains a scope), on a SQLite file in either pass: that old database only ever
 * existed as a SQLite file (PostgreSQL state began with the OAuth tables in its schema).
 */
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { buildServerConfig, type ServerConfig } from "../../src/config.js";
import { OAuthClients } from "../../src/oauth/clients.js";
import { createOAuth } from "../../src/oauth/index.js";
import { OAuthStore } from "../../src/oauth/store.js";
import { hashToken, TokenStore } from "../../src/principals/tokens.js";
import { startServer } from "../../src/server.js";
import { MIGRATIONS } from "../../src/state/schema.js";
import { created, mcpPost } from "../support/oauth.js";
import { openTestState } from "../support/test-state.js";

const silent = pino({ level: "silent" });
const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function tempDir(): string {
  const d = mkdtempSync(join(tmpdir(), "wc-oauth-store-"));
  dirs.push(d);
  return d;
}

function config(dir: string, publicUrl: string, oauth: Record<string, unknown> = {}): ServerConfig {
  return buildServerConfig(
    {
      server: { host: "127.0.0.1", port: 0, state_dir: "state", public_url: publicUrl },
      oauth: { enabled: true, ...oauth },
      principals: [{ id: "alice", scopes: ["coding_agent:run", "project:write", "project:read"], projects: ["demo"] }],
    },
    { file: null, baseDir: dir },
  );
}

const TTL = { accessMs: 3_600_000, refreshMs: 86_400_000, reuseGraceMs: 0 };

describe("OAuth config", () => {
  const build = (server: Record<string, unknown>, oauth: Record<string, unknown> | undefined) =>
    buildServerConfig(
      { server: { port: 0, ...server }, ...(oauth ? { oauth } : {}) },
      { file: null, baseDir: tmpdir() },
    );

  it("needs public_url when enabled, https unless loopback, an origin without path; off by default", () => {
    expect(build({}, undefined).oauth).toBeNull();
    expect(() => build({}, { enabled: true })).toThrow(/server.public_url: required when oauth.enabled/);
    expect(() => build({ public_url: "http://mcp.example.com" }, { enabled: true })).toThrow(/https unless/);
    expect(() => build({ public_url: "https://mcp.example.com/base" }, { enabled: true })).toThrow(/no path/);
    expect(() => build({ public_url: "https://mcp.example.com" }, { enabled: true, unknown: 1 })).toThrow(/unknown/);
    const cfg = build({ public_url: "https://mcp.example.com/" }, { enabled: true });
    expect(cfg.oauth).toMatchObject({
      issuer: "https://mcp.example.com",
      resource: "https://mcp.example.com/mcp",
      accessTokenTtlSecs: 3600,
      devAllowLoopbackClientMetadata: false,
    });
    expect(build({ public_url: "http://127.0.0.1:7420" }, { enabled: true }).oauth?.resource).toBe(
      "http://127.0.0.1:7420/mcp",
    );
  });
});

describe("OAuth store", () => {
  it("a token issued for one resource is refused by a Server whose resource is another (audience binding)", async () => {
    const { dir, store: state } = await openTestState();
    const cfgA = config(dir, "https://a.example");
    const cfgB = config(dir, "https://b.example");
    const tokens = new TokenStore(state.engine);
    const lookup = (id: string) => cfgA.principals.find((p) => p.id === id);
    const key = await tokens.issue(
      { principal_id: "alice", scopes: ["project:read"], projects: ["demo"], allowCodingAgentRun: false },
      lookup,
    );
    const a = await createOAuth({
      settings: cfgA.oauth!,
      engine: state.engine,
      tokens,
      principals: cfgA.principals,
      logger: silent,
    });
    await a.store.upsertClient({
      client_id: "c1",
      kind: "dynamic",
      client_name: "c",
      redirect_uris: ["https://app.example/cb"],
    });
    const { code } = await created(
      a.store.createGrantWithCode(
        {
          client_id: "c1",
          principal_id: "alice",
          key_id: key.token_id,
          scopes: ["project:read"],
          projects: ["demo"],
          resource: cfgA.oauth!.resource,
        },
        { redirect_uri: "https://app.example/cb", code_challenge: "x" },
      ),
    );
    const r = await a.store.redeemCode(code, "c1", "https://app.example/cb", TTL);
    if (!r.ok) throw new Error(r.reason);
    expect((await a.authenticate(r.pair.access_token))?.id).toBe("alice");
    const b = await createOAuth({
      settings: cfgB.oauth!,
      engine: state.engine,
      tokens,
      principals: cfgB.principals,
      logger: silent,
    });
    expect(await b.authenticate(r.pair.access_token)).toBeNull();
    // Revoking the access key the person typed ends the grant's tokens too.
    await tokens.revoke(key.token_id);
    expect(await a.authenticate(r.pair.access_token)).toBeNull();
    // The audit rows hold ids and scopes, never the code or a token.
    const audit = JSON.stringify(await a.store.auditRows());
    expect(audit).toContain('"event":"grant"');
    expect(audit).not.toContain(code);
    expect(audit).not.toContain(r.pair.access_token);
    expect(audit).not.toContain(r.pair.refresh_token);
  });

  it("keeps dynamic clients within max_dynamic_clients: the oldest unused one makes room, clients with live grants stay", async () => {
    const { dir, store: state } = await openTestState();
    const cfg = config(dir, "https://a.example", { max_dynamic_clients: 2 });
    const store = new OAuthStore(state.engine);
    const clients = new OAuthClients({ store, settings: cfg.oauth!, logger: silent });
    const reg = async (id: string) =>
      (await clients.registerClient({ client_id: id, redirect_uris: ["https://app.example/cb"] } as never)).client_id;
    await reg("one");
    await reg("two");
    await reg("three");
    expect((await store.clients()).map((c) => c.client_id).sort()).toEqual(["three", "two"]);
    for (const id of ["two", "three"]) {
      await store.createGrantWithCode(
        { client_id: id, principal_id: "alice", key_id: null, scopes: ["project:read"], projects: [], resource: "r" },
        { redirect_uri: "https://app.example/cb", code_challenge: "x" },
      );
    }
    await expect(reg("four")).rejects.toThrow(/as many registered clients/);
    await expect(
      clients.registerClient({ client_id: "five", redirect_uris: ["http://evil.example/cb"] } as never),
    ).rejects.toThrow(/loopback/);
  });

  // SQLite only: the database from before OAuth is a SQLite file (see the top of this file).
  it("opens a state database from before OAuth: static tokens keep their exact scopes and no client is provisioned", async () => {
    const dir = tempDir();
    const cfg = config(dir, "http://127.0.0.1:1");
    // The pre-OAuth schema of principal_tokens, with one narrow and one coding-agent token.
    mkdirSync(cfg.stateDir, { recursive: true });
    const old = new Database(join(cfg.stateDir, "server.sqlite3"));
    old.exec(`CREATE TABLE principal_tokens (token_hash TEXT PRIMARY KEY, token_id TEXT NOT NULL UNIQUE,
      principal_id TEXT NOT NULL, scopes TEXT NOT NULL, projects TEXT NOT NULL, created_at TEXT NOT NULL, revoked_at TEXT);`);
    const narrow = `wct_${"n".repeat(43)}`;
    const runner = `wct_${"r".repeat(43)}`;
    const insert = old.prepare(
      "INSERT INTO principal_tokens VALUES (?, ?, 'alice', ?, '[\"demo\"]', '2026-01-01T00:00:00Z', NULL)",
    );
    insert.run(hashToken(narrow), "tok_narrow", JSON.stringify(["project:read"]));
    insert.run(hashToken(runner), "tok_runner", JSON.stringify(["coding_agent:run", "project:write"]));
    old.close();

    const server = await startServer({ config: cfg, logger: silent, mcp: true, env: {} });
    try {
      // The OAuth tables arrive as their own forward step; every step ran once.
      expect(server.store.migrated).toEqual(MIGRATIONS.map((m) => m.version));
      expect(MIGRATIONS.find((m) => m.sql.includes("oauth_clients"))).toBeDefined();
      const origin = server.url;
      const call = {
        method: "tools/call",
        params: { name: "cancel_coding_agent", arguments: { run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa" } },
      };
      // The narrow token still gets the old tool-level refusal (not an OAuth 403), as before.
      const refused = await mcpPost(origin, narrow, call);
      expect(refused.status).toBe(200);
      expect(refused.body).toContain("forbidden");
      const ok = await mcpPost(origin, runner, call);
      expect(ok.status).toBe(200);
      expect(ok.body).toContain("not_found");
      const rows = server.store.sqlite
        .prepare("SELECT token_id, scopes FROM principal_tokens ORDER BY token_id")
        .all() as Array<{ token_id: string; scopes: string }>;
      expect(rows).toEqual([
        { token_id: "tok_narrow", scopes: '["project:read"]' },
        { token_id: "tok_runner", scopes: '["coding_agent:run","project:write"]' },
      ]);
      const provisioned = server.store.sqlite
        .prepare("SELECT COUNT(*) AS n FROM oauth_clients WHERE allow_coding_agent_run != 0")
        .get() as { n: number };
      expect(provisioned.n).toBe(0);
      expect((server.store.sqlite.prepare("SELECT COUNT(*) AS n FROM oauth_grants").get() as { n: number }).n).toBe(0);
    } finally {
      await server.close();
    }
  });
});
