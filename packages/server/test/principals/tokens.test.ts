/**
 * Principal tokens (principals/tokens.ts) on the state engine of the pass (support/test-state.ts): SQLite
 * in the main pass, PostgreSQL in the PostgreSQL pass.
 */
import { beforeEach, describe, expect, it } from "vitest";
import { buildServerConfig } from "../../src/config.js";
import {
  bearerToken,
  type ConfiguredPrincipal,
  createAuthenticator,
  hashToken,
  principalLookup,
  TokenIssueError,
  TokenStore,
} from "../../src/principals/tokens.js";
import { openTestState, type TestState } from "../support/test-state.js";

let state: TestState;
let dir: string;
let store: TokenStore;
const principals: ConfiguredPrincipal[] = [
  { id: "alice", scopes: ["coding_agent:run", "project:write", "project:read"], projects: ["demo", "docs"] },
  { id: "ops", scopes: ["project:write", "job:run", "mcp:local", "runtime:read"], projects: ["demo"] },
];

beforeEach(async () => {
  state = await openTestState();
  dir = state.dir;
  store = new TokenStore(state.engine);
});

const issueAlice = (over: Partial<Parameters<TokenStore["issue"]>[0]> = {}) =>
  store.issue(
    {
      principal_id: "alice",
      scopes: ["coding_agent:run", "project:write"],
      projects: ["demo"],
      allowCodingAgentRun: true,
      ...over,
    },
    principalLookup(principals),
  );

describe("token issue and verify", () => {
  it("verifies an issued token to its principal with exactly the issued scopes and projects", async () => {
    const issued = await issueAlice();
    expect(issued.token).toMatch(/^wct_[A-Za-z0-9_-]{43}$/);
    const p = await store.verify(issued.token, principalLookup(principals));
    expect(p?.id).toBe("alice");
    expect([...(p?.scopes ?? [])].sort()).toEqual(["coding_agent:run", "project:write"]);
    expect([...(p?.projects ?? [])]).toEqual(["demo"]);
  });

  it("stores only the sha256 of the token, never the token", async () => {
    const issued = await issueAlice();
    const text = await state.text();
    expect(text).not.toContain(issued.token);
    expect(text).not.toContain(issued.token.slice(4, 24));
    const other = await state.another();
    expect(await other.all("SELECT token_hash FROM principal_tokens")).toEqual([
      { token_hash: hashToken(issued.token) },
    ]);
  });

  it("refuses coding_agent:run without the explicit opt-in", async () => {
    await expect(issueAlice({ allowCodingAgentRun: false })).rejects.toThrow(/--allow-coding-agent-run/);
    await expect(issueAlice({ allowCodingAgentRun: false, scopes: ["project:write"] })).resolves.toBeDefined();
  });

  it("refuses scopes and projects the config does not grant, and unknown scopes", async () => {
    await expect(issueAlice({ scopes: ["job:run"] })).rejects.toThrow(TokenIssueError);
    await expect(issueAlice({ projects: ["secret"] })).rejects.toThrow(/not granted/);
    await expect(issueAlice({ scopes: ["root"] })).rejects.toThrow(/unknown scope/);
    await expect(issueAlice({ principal_id: "mallory" })).rejects.toThrow(/not declared/);
    await expect(issueAlice({ scopes: [] })).rejects.toThrow(/at least one/);
  });

  it("never widens a token when the config later grants its principal more", async () => {
    const issued = await issueAlice({ scopes: ["project:write"], allowCodingAgentRun: false });
    const widened: ConfiguredPrincipal[] = [
      {
        id: "alice",
        scopes: ["coding_agent:run", "project:write", "project:read", "job:run"],
        projects: ["demo", "x"],
      },
    ];
    const p = await store.verify(issued.token, principalLookup(widened));
    expect([...(p?.scopes ?? [])]).toEqual(["project:write"]);
    expect([...(p?.projects ?? [])]).toEqual(["demo"]);
  });

  it("narrows a token at once when the config takes a scope or project away, and drops removed principals", async () => {
    const issued = await issueAlice();
    const narrowed: ConfiguredPrincipal[] = [{ id: "alice", scopes: ["project:write"], projects: [] }];
    const p = await store.verify(issued.token, principalLookup(narrowed));
    expect([...(p?.scopes ?? [])]).toEqual(["project:write"]);
    expect(p?.projects.size).toBe(0);
    expect(await store.verify(issued.token, principalLookup([]))).toBeNull();
  });

  it("rejects unknown, tampered, malformed and revoked tokens", async () => {
    const issued = await issueAlice();
    const lookup = principalLookup(principals);
    const last = issued.token.at(-1) === "A" ? "B" : "A";
    expect(await store.verify(`${issued.token.slice(0, -1)}${last}`, lookup)).toBeNull();
    expect(await store.verify(`wct_${"A".repeat(43)}`, lookup)).toBeNull();
    expect(await store.verify("", lookup)).toBeNull();
    expect(await store.verify(hashToken(issued.token), lookup)).toBeNull();
    expect((await store.verify(issued.token, lookup))?.id).toBe("alice");
    expect(await store.revoke(issued.token_id)).toBe(true);
    expect(await store.verify(issued.token, lookup)).toBeNull();
    expect(await store.revoke(issued.token_id)).toBe(false);
    expect((await store.list("alice"))[0]?.revoked_at).not.toBeNull();
  });

  it("applies a revocation made by another process (the token CLI) from the next verify on", async () => {
    const issued = await issueAlice();
    const lookup = principalLookup(principals);
    for (let i = 0; i < 3; i++) expect((await store.verify(issued.token, lookup))?.id).toBe("alice");
    const cli = await state.another();
    expect(await new TokenStore(cli).revoke(issued.token_id)).toBe(true);
    expect(await store.verify(issued.token, lookup)).toBeNull();
  });

  it("authenticates config-declared hashes with their fixed token_scopes", async () => {
    const token = "static-token-for-tests-0123456789";
    const auth = createAuthenticator(store, [
      {
        id: "bot",
        scopes: ["project:read"],
        projects: ["demo"],
        token_sha256: [hashToken(token)],
        token_scopes: ["project:read"],
      },
    ]);
    expect((await auth(token))?.id).toBe("bot");
    expect([...((await auth(token))?.scopes ?? [])]).toEqual(["project:read"]);
    expect(await auth("other")).toBeNull();
  });

  it("does not widen config-declared hashes when the principal's config scopes widen", async () => {
    const token = "static-token-for-tests-0123456789";
    const doc = (scopes: string[], extra: Record<string, unknown> = {}) => ({
      principals: [
        {
          id: "bot",
          scopes,
          projects: ["demo"],
          token_sha256: [hashToken(token)],
          token_scopes: ["project:read"],
          ...extra,
        },
      ],
    });
    const before = buildServerConfig(doc(["project:read"]), { file: null, baseDir: dir });
    expect([...((await createAuthenticator(store, before.principals)(token))?.scopes ?? [])]).toEqual(["project:read"]);
    const widened = buildServerConfig(doc(["project:read", "project:write", "coding_agent:run"]), {
      file: null,
      baseDir: dir,
    });
    const p = await createAuthenticator(store, widened.principals)(token);
    expect(p?.scopes.has("coding_agent:run")).toBe(false);
    expect(p?.scopes.has("project:write")).toBe(false);
    // coding_agent:run on inline tokens needs the explicit per-principal opt-in.
    expect(() =>
      buildServerConfig(doc(["coding_agent:run"], { token_scopes: ["coding_agent:run"] }), {
        file: null,
        baseDir: dir,
      }),
    ).toThrow(/allow_coding_agent_run/);
    const optedIn = buildServerConfig(
      doc(["coding_agent:run"], { token_scopes: ["coding_agent:run"], allow_coding_agent_run: true }),
      { file: null, baseDir: dir },
    );
    expect((await createAuthenticator(store, optedIn.principals)(token))?.scopes.has("coding_agent:run")).toBe(true);
    // An inline hash without an explicit scope list is a config error, not "whatever the principal has".
    expect(() =>
      buildServerConfig(
        { principals: [{ id: "bot", scopes: ["project:read"], token_sha256: [hashToken(token)] }] },
        {
          file: null,
          baseDir: dir,
        },
      ),
    ).toThrow(/token_scopes/);
  });

  it("parses bearer headers strictly", async () => {
    expect(bearerToken("Bearer abc")).toBe("abc");
    expect(bearerToken("bearer abc")).toBe("abc");
    expect(bearerToken("Basic abc")).toBeNull();
    expect(bearerToken("Bearer a b")).toBeNull();
    expect(bearerToken(undefined)).toBeNull();
  });
});
