/**
 * The operator:read scope and the console's bounds, over HTTP against a real Server child process:
 * `token issue` gives operator:read only to a principal the config grants it; OAuth consent grants it only
 * to a client the operator provisioned (`oauth clients allow-operator-read`) and never by default; the
 * console's event streams are capped per principal; bad filters and bodies get precise errors; a session
 * ends at logout and when its key is revoked.
 */
import { createHash, randomBytes } from "node:crypto";
import { PROTOCOL_VERSION } from "@webcodex/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CONSOLE_LOGIN_MAX_FAILURES_PER_SOURCE, CONSOLE_MAX_STREAMS_PER_PRINCIPAL } from "../../src/console/http.js";
import { CONSOLE_SESSION_TTL_MS, ConsoleSessions } from "../../src/console/sessions.js";
import { maskPaths, PATH_MASK } from "../../src/console/views.js";
import { PRESENCE_STALE_MS, PresenceStore, presenceAt } from "../../src/link/presence.js";
import { StateStore } from "../../src/state/store.js";
import { consoleLogin } from "../support/console-login.js";
import { answerConsent, issueKey, openConsent, serverCli, tokenRequest } from "../support/oauth.js";
import { ProcStack } from "../support/proc-stack.js";

const REDIRECT = "https://app.example/callback";

let stack: ProcStack;
let origin: string;
let operatorKey: string;

beforeAll(async () => {
  stack = await new ProcStack({
    runners: [],
    server: "child",
    // The test talks to the Server as a trusted proxy would: X-Forwarded-For names the client.
    serverSection: (port) => `public_url = "http://127.0.0.1:${port}"\ntrusted_proxies = ["127.0.0.1"]`,
    extraServerToml:
      '[oauth]\nenabled = true\n\n[[principals]]\nid = "carol"\nscopes = ["project:read", "coding_agent:run"]\nprojects = []\n',
    extraScopes: ["operator:read"],
  }).init();
  origin = `http://127.0.0.1:${stack.port}`;
  operatorKey = await issueKey(stack.serverConfigFile, "alice", ["operator:read", "project:read"], []);
});

afterAll(async () => {
  await stack?.stop();
});

function cli(...args: string[]) {
  return serverCli([...args, "--config", stack.serverConfigFile]);
}

/** Sign in to this file's Server (support/console-login.ts). */
function login(key: string, client?: string) {
  return consoleLogin(origin, key, client);
}

async function consentToken(clientId: string, scope: string | null, key: string) {
  const verifier = randomBytes(32).toString("base64url");
  const u = new URL(`${origin}/authorize`);
  const params: Record<string, string> = {
    response_type: "code",
    client_id: clientId,
    redirect_uri: REDIRECT,
    code_challenge: createHash("sha256").update(verifier).digest("base64url"),
    code_challenge_method: "S256",
    state: "s",
    resource: `${origin}/mcp`,
  };
  if (scope !== null) params.scope = scope;
  u.search = new URLSearchParams(params).toString();
  const page = await openConsent(u);
  const answered = await answerConsent(origin, page, { action: "approve", key });
  const code = answered.location?.searchParams.get("code") ?? "";
  const t = await tokenRequest(origin, {
    grant_type: "authorization_code",
    client_id: clientId,
    code,
    code_verifier: verifier,
    redirect_uri: REDIRECT,
  });
  return { page: page.html, scopes: String(t.body.scope ?? "").split(" ") };
}

describe("the operator:read scope", () => {
  it("is issued by token issue only to a principal the config grants it", async () => {
    const refused = await cli("token", "issue", "--principal", "carol", "--scope", "operator:read").catch(
      (err: { stderr?: string }) => err,
    );
    expect(String((refused as { stderr?: string }).stderr)).toContain(
      "scope 'operator:read' is not granted to principal 'carol'",
    );
    const { stdout } = await cli("token", "issue", "--principal", "alice", "--scope", "operator:read", "--json");
    expect((JSON.parse(stdout) as { scopes: string[] }).scopes).toEqual(["operator:read"]);
  });

  it("is granted through OAuth consent only to a client the operator provisioned, and never by default", async () => {
    const reg = await fetch(`${origin}/register`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ client_name: "Ops app", redirect_uris: [REDIRECT], token_endpoint_auth_method: "none" }),
    });
    const clientId = ((await reg.json()) as { client_id: string }).client_id;
    const before = await consentToken(clientId, "project:read operator:read", operatorKey);
    expect(before.scopes).toEqual(["project:read"]);
    expect(before.page).not.toContain("operator:read");

    await cli("oauth", "clients", "allow-operator-read", clientId);
    const after = await consentToken(clientId, "project:read operator:read", operatorKey);
    expect(after.scopes.sort()).toEqual(["operator:read", "project:read"]);
    expect(after.page).toContain("operator:read");
    const byDefault = await consentToken(clientId, null, operatorKey);
    expect(byDefault.scopes).not.toContain("operator:read");

    const { stdout } = await cli("oauth", "audit", "list", "--json");
    const rows = JSON.parse(stdout) as { event: string; client_id: string; scopes: string | null }[];
    expect(
      rows.some((r) => r.event === "client_provisioned" && r.client_id === clientId && r.scopes === "operator:read"),
    ).toBe(true);
  });
});

describe("console sessions and bounds", () => {
  it("caps event streams per principal and answers 429 past it", async () => {
    const s = await login(operatorKey);
    expect(s.status).toBe(303);
    const cookie = s.cookie ?? "";
    const open: AbortController[] = [];
    try {
      for (let i = 0; i < CONSOLE_MAX_STREAMS_PER_PRINCIPAL; i++) {
        const ac = new AbortController();
        open.push(ac);
        const r = await fetch(`${origin}/console/events`, { headers: { cookie }, signal: ac.signal });
        expect(r.status).toBe(200);
      }
      const over = await fetch(`${origin}/console/events`, { headers: { cookie } });
      expect(over.status).toBe(429);
      expect(((await over.json()) as { error: string }).error).toContain("per principal");
    } finally {
      for (const ac of open) ac.abort();
    }
  });

  it("names the bad filter and what is allowed", async () => {
    const { cookie } = await login(operatorKey);
    const r = await fetch(`${origin}/console/api/snapshot?state=sleeping`, { headers: { cookie: cookie ?? "" } });
    expect(r.status).toBe(400);
    expect(((await r.json()) as { error: string }).error).toMatch(/^state: must be "active" or one of starting/);
  });

  it("refuses a POST from another origin even with the CSRF token, and ends the session at logout", async () => {
    const { cookie, csrf } = await login(operatorKey);
    const headers = { cookie: cookie ?? "", "content-type": "application/x-www-form-urlencoded" };
    const foreign = await fetch(`${origin}/console/logout`, {
      method: "POST",
      redirect: "manual",
      headers: { ...headers, origin: "https://evil.example" },
      body: new URLSearchParams({ csrf: csrf ?? "" }),
    });
    expect(foreign.status).toBe(403);
    expect((await fetch(`${origin}/console/api/snapshot`, { headers })).status).toBe(200);
    const out = await fetch(`${origin}/console/logout`, {
      method: "POST",
      redirect: "manual",
      headers: { ...headers, origin },
      body: new URLSearchParams({ csrf: csrf ?? "" }),
    });
    expect(out.status).toBe(303);
    expect((await fetch(`${origin}/console/api/snapshot`, { headers })).status).toBe(401);
  });

  it("ends a session from the next request once its key is revoked", async () => {
    const key = await issueKey(stack.serverConfigFile, "alice", ["operator:read"], []);
    const { cookie } = await login(key);
    const headers = { cookie: cookie ?? "" };
    expect((await fetch(`${origin}/console/api/snapshot`, { headers })).status).toBe(200);
    const { stdout } = await cli("token", "list", "--principal", "alice");
    const id = stdout
      .split("\n")
      .filter((l) => l.includes("\toperator:read\t") && l.endsWith("active"))
      .at(-1)
      ?.split("\t")[0];
    await cli("token", "revoke", "--id", id ?? "");
    expect((await fetch(`${origin}/console/api/snapshot`, { headers })).status).toBe(401);
  });

  it("a session outlives neither its lifetime nor a malformed cookie", async () => {
    let now = 1_000_000;
    const state = new StateStore(`${stack.dir}/sessions-unit`);
    try {
      const sessions = new ConsoleSessions(state.engine, () => now);
      const id = await sessions.open("alice", "tok_x");
      expect((await sessions.get(id))?.principal_id).toBe("alice");
      expect(await sessions.get(`${id}x`)).toBeNull();
      now += CONSOLE_SESSION_TTL_MS;
      expect(await sessions.get(id)).toBeNull();
    } finally {
      await state.close();
    }
  });

  it("reads a Runner as offline once its Server stopped refreshing its presence, since it was last seen", async () => {
    const state = new StateStore(`${stack.dir}/presence-unit`);
    try {
      const presence = new PresenceStore(state.engine, (err) => {
        throw err;
      });
      const t0 = 2_000_000_000_000;
      await presence.online(
        {
          runner_id: "r9",
          protocol_version: PROTOCOL_VERSION,
          agent_instance_id: "a",
          store_id: "s",
          projects: [{ project_id: "p", allow_patch: true }],
          providers: [{ provider_id: "fake", name: "Fake", provider_instance_id: "p", allowed_config_options: [] }],
          max_concurrent_runs: 2,
          agents_share_runner_user: false,
          runner_version: "9.9.9",
        },
        new Date(t0),
      );
      const row = async () => (await presence.rows()).find((r) => r.runner_id === "r9")!;
      expect(presenceAt(await row(), t0 + PRESENCE_STALE_MS - 1)).toEqual({
        online: true,
        since: new Date(t0).toISOString(),
      });
      await presence.seen(["r9"], t0 + 10_000);
      expect(presenceAt(await row(), t0 + 10_000 + PRESENCE_STALE_MS - 1).online).toBe(true);
      expect(presenceAt(await row(), t0 + 10_000 + PRESENCE_STALE_MS)).toEqual({
        online: false,
        since: new Date(t0 + 10_000).toISOString(),
      });
      await presence.offline("r9", new Date(t0 + 20_000));
      expect(presenceAt(await row(), t0 + 20_001)).toEqual({
        online: false,
        since: new Date(t0 + 20_000).toISOString(),
      });
    } finally {
      await state.close();
    }
  });

  it("masks absolute paths in agent-written labels and keeps project-relative ones", () => {
    expect(maskPaths("Edit src/math.js")).toBe("Edit src/math.js");
    expect(maskPaths("Read /home/alice/secret.txt now")).toBe(`Read ${PATH_MASK} now`);
    expect(maskPaths('open "C:\\Users\\bob\\x.txt"')).toBe(`open "${PATH_MASK}"`);
    expect(maskPaths("cat ~/.ssh/id_ed25519")).toBe(`cat ${PATH_MASK}`);
  });

  it("counts wrong keys per client behind a trusted proxy: one client's 429 leaves another's login alone", async () => {
    const guesser = "203.0.113.7";
    for (let i = 0; i < CONSOLE_LOGIN_MAX_FAILURES_PER_SOURCE; i++) {
      expect((await login(`wct_${randomBytes(32).toString("base64url").slice(0, 43)}`, guesser)).status).toBe(401);
    }
    expect((await login(operatorKey, guesser)).status).toBe(429);
    const other = await login(operatorKey, "203.0.113.8");
    expect(other.status).toBe(303);
    expect(other.cookie).not.toBeNull();
  });

  // Last in this file: it blocks logins from this address for the rest of the window.
  it("answers 429 to an address past its wrong-key limit, even with a right key never used from there", async () => {
    for (let i = 0; i < CONSOLE_LOGIN_MAX_FAILURES_PER_SOURCE; i++) {
      expect((await login(`wct_${randomBytes(32).toString("base64url").slice(0, 43)}`)).status).toBe(401);
    }
    const unused = await issueKey(stack.serverConfigFile, "alice", ["operator:read"], []);
    const blocked = await login(unused);
    expect(blocked.status).toBe(429);
    expect(blocked.cookie).toBeNull();
  });
});
