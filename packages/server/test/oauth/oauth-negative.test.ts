/**
 * Issue 13 negative cases against a real Server child process, over raw HTTP
 * (the requests a hostile or broken client could send): wrong key and the
 * key-attempt bound, CSRF, PKCE mismatch, `plain`, reused code, a wrong
 * `resource`, redirect URI mismatch, deny, a key without
 * coding_agent:run at a provisioned client, a tool named after an
 * Object.prototype member, operator revocation, and the
 * registration rate limit.
 */
import { createHash, randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HOLD_KEY_LOOKUPS, heldRace } from "../support/held-race.js";
import { answerConsent, issueKey, mcpPost, openConsent, serverCli, tokenRequest } from "../support/oauth.js";
import { ProcStack } from "../support/proc-stack.js";

const MAX_KEY_ATTEMPTS = 3;
const REGISTRATIONS_PER_HOUR = 30;
const REDIRECT = "https://app.example/callback";

let stack: ProcStack;
let origin: string;
let runKey: string;
let readKey: string;
let registrations = 0;

/** This file's Server child: OAuth on, MAX_KEY_ATTEMPTS, the provisioned client `ops-ide`; `serverEnv` for test hooks. */
const oauthStack = (serverEnv?: Record<string, string>) =>
  new ProcStack({
    runners: [],
    server: "child",
    serverSection: (port) => `public_url = "http://127.0.0.1:${port}"`,
    extraServerToml:
      `[oauth]\nenabled = true\nmax_key_attempts = ${MAX_KEY_ATTEMPTS}\n` +
      `registrations_per_hour = ${REGISTRATIONS_PER_HOUR}\n\n` +
      `[[oauth.clients]]\nclient_id = "ops-ide"\nname = "Ops IDE"\nredirect_uris = ["${REDIRECT}"]\n`,
    ...(serverEnv ? { serverEnv } : {}),
  }).init();

beforeAll(async () => {
  stack = await oauthStack();
  origin = `http://127.0.0.1:${stack.port}`;
  runKey = await issueKey(stack.serverConfigFile, "alice", ["coding_agent:run", "project:write", "project:read"], []);
  readKey = await issueKey(stack.serverConfigFile, "bob", ["project:read", "project:write"], []);
});

afterAll(async () => {
  await stack?.stop();
});

async function register(redirectUris: string[] = [REDIRECT]): Promise<string> {
  registrations += 1;
  const res = await fetch(`${origin}/register`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      client_name: "Raw client",
      redirect_uris: redirectUris,
      token_endpoint_auth_method: "none",
    }),
  });
  expect(res.status).toBe(201);
  const body = (await res.json()) as { client_id: string; client_secret?: string; token_endpoint_auth_method: string };
  expect(body.client_secret).toBeUndefined();
  expect(body.token_endpoint_auth_method).toBe("none");
  return body.client_id;
}

function pkce(): { verifier: string; challenge: string } {
  const verifier = randomBytes(32).toString("base64url");
  return { verifier, challenge: createHash("sha256").update(verifier).digest("base64url") };
}

function authorizeUrl(
  clientId: string,
  challenge: string,
  over: Record<string, string | null> = {},
  at = origin,
): string {
  const params: Record<string, string | null> = {
    response_type: "code",
    client_id: clientId,
    redirect_uri: REDIRECT,
    code_challenge: challenge,
    code_challenge_method: "S256",
    scope: "coding_agent:run project:write project:read",
    state: "s1",
    resource: `${at}/mcp`,
    ...over,
  };
  const u = new URL(`${at}/authorize`);
  for (const [k, v] of Object.entries(params)) if (v !== null) u.searchParams.set(k, v);
  return u.href;
}

/** Register, consent with `key`, and return the code with its verifier. */
async function codeFor(key: string, opts: { clientId?: string; codingAgentRun?: boolean } = {}) {
  const clientId = opts.clientId ?? (await register());
  const { verifier, challenge } = pkce();
  const page = await openConsent(authorizeUrl(clientId, challenge));
  expect(page.status).toBe(200);
  const answered = await answerConsent(origin, page, {
    action: "approve",
    key,
    codingAgentRun: opts.codingAgentRun ?? false,
  });
  expect(answered.status).toBe(200);
  const code = answered.location?.searchParams.get("code");
  if (!code) throw new Error(`no code: ${answered.location?.href}`);
  return { clientId, code, verifier };
}

async function exchange(clientId: string, code: string, verifier: string, extra: Record<string, string> = {}) {
  return tokenRequest(origin, {
    grant_type: "authorization_code",
    client_id: clientId,
    code,
    code_verifier: verifier,
    redirect_uri: REDIRECT,
    ...extra,
  });
}

describe("OAuth negative paths", () => {
  it("a wrong key re-shows the page without redirecting; past the bound even the right key is refused for that client and IP", async () => {
    const clientId = await register();
    const page = await openConsent(authorizeUrl(clientId, pkce().challenge));
    for (let i = 0; i < MAX_KEY_ATTEMPTS; i++) {
      const wrongKey = `wct_${randomBytes(32).toString("base64url")}`;
      const r = await answerConsent(origin, page, { action: "approve", key: wrongKey });
      expect(r.status).toBe(401);
      expect(r.location).toBeNull();
      expect(r.html).toContain("That access key is not valid");
      expect(r.html).not.toContain(wrongKey);
    }
    const blocked = await answerConsent(origin, page, { action: "approve", key: runKey });
    expect(blocked.status).toBe(429);
    expect(blocked.location).toBeNull();
    expect(blocked.html).toContain("Too many wrong keys");
    // Another client's budget is its own.
    await codeFor(runKey);
  });

  it("a consent post with a CSRF token that does not match its cookie gets a page, not a redirect", async () => {
    const clientId = await register();
    const page = await openConsent(authorizeUrl(clientId, pkce().challenge));
    expect(page.cookie).toMatch(/^wc_csrf_/);
    const forged = await answerConsent(origin, page, { action: "approve", key: runKey, csrf: "forged" });
    expect(forged.status).toBe(403);
    expect(forged.location).toBeNull();
    const noCookie = await answerConsent(origin, page, { action: "approve", key: runKey, cookie: "other=1" });
    expect(noCookie.status).toBe(403);
  });

  it("the consent page forbids framing and scripts and loads nothing from elsewhere", async () => {
    const clientId = await register();
    const res = await fetch(authorizeUrl(clientId, pkce().challenge));
    const csp = res.headers.get("content-security-policy") ?? "";
    expect(csp).toContain("frame-ancestors 'none'");
    expect(csp).toContain("default-src 'none'");
    expect(csp).not.toContain("script-src");
    expect(res.headers.get("x-frame-options")).toBe("DENY");
    const html = await res.text();
    expect(html).not.toMatch(/<script|src="http|href="http/);
  });

  it("deny returns access_denied with the state to the client", async () => {
    const clientId = await register();
    const page = await openConsent(authorizeUrl(clientId, pkce().challenge));
    const r = await answerConsent(origin, page, { action: "deny" });
    expect(r.status).toBe(302);
    expect(r.location?.origin + (r.location?.pathname ?? "")).toBe(REDIRECT);
    expect(r.location?.searchParams.get("error")).toBe("access_denied");
    expect(r.location?.searchParams.get("state")).toBe("s1");
    expect(r.location?.searchParams.get("code")).toBeNull();
  });

  it("a PKCE verifier that does not match the challenge gets invalid_grant", async () => {
    const { clientId, code } = await codeFor(runKey);
    const r = await exchange(clientId, code, pkce().verifier);
    expect(r.status).toBe(400);
    expect(r.body.error).toBe("invalid_grant");
  });

  it("code_challenge_method=plain is refused back to the client with invalid_request", async () => {
    // A client a person already allowed (its redirect is confirmed) gets the error back.
    const { clientId } = await codeFor(readKey);
    const res = await fetch(authorizeUrl(clientId, "a".repeat(43), { code_challenge_method: "plain" }), {
      redirect: "manual",
    });
    expect(res.status).toBe(302);
    const loc = new URL(res.headers.get("location") ?? "");
    expect(loc.searchParams.get("error")).toBe("invalid_request");
    expect(loc.searchParams.get("code")).toBeNull();
  });

  it("a reused code is refused and revokes the tokens the first use produced", async () => {
    const { clientId, code, verifier } = await codeFor(runKey);
    const first = await exchange(clientId, code, verifier);
    expect(first.status).toBe(200);
    const access = String(first.body.access_token);
    expect((await mcpPost(origin, access, { method: "tools/list" })).status).toBe(200);
    const again = await exchange(clientId, code, verifier);
    expect(again.status).toBe(400);
    expect(again.body.error).toBe("invalid_grant");
    expect((await mcpPost(origin, access, { method: "tools/list" })).status).toBe(401);
  });

  it("a resource other than this /mcp is refused at authorize (with iss) and at the token endpoint", async () => {
    const { clientId } = await codeFor(readKey);
    for (const resource of ["https://other.example/mcp", `${origin}/other`]) {
      const res = await fetch(authorizeUrl(clientId, pkce().challenge, { resource }), { redirect: "manual" });
      expect(res.status).toBe(302);
      const location = new URL(res.headers.get("location") ?? "");
      expect(location.searchParams.get("error")).toBe("invalid_target");
      expect(location.searchParams.get("iss")).toBe(origin);
    }
    const { clientId: c2, code, verifier } = await codeFor(runKey);
    const r = await exchange(c2, code, verifier, { resource: "https://other.example/mcp" });
    expect(r.status).toBe(400);
    expect(r.body.error).toBe("invalid_target");
  });

  it("a redirect URI the client did not register gets an error page, never a redirect", async () => {
    const clientId = await register();
    const res = await fetch(authorizeUrl(clientId, pkce().challenge, { redirect_uri: "https://evil.example/cb" }), {
      redirect: "manual",
    });
    expect(res.status).toBe(400);
    expect(res.headers.get("location")).toBeNull();
    expect(await res.text()).toContain("return address is not registered");
    const unknown = await fetch(authorizeUrl("no-such-client", pkce().challenge), { redirect: "manual" });
    expect(unknown.status).toBe(400);
    expect(unknown.headers.get("location")).toBeNull();
  });

  it("a loopback redirect URI matches on any port (RFC 8252), but not on another path or host", async () => {
    const clientId = await register(["http://127.0.0.1/native-cb"]);
    const { challenge, verifier } = pkce();
    const ok = await openConsent(
      authorizeUrl(clientId, challenge, { redirect_uri: "http://127.0.0.1:55123/native-cb" }),
    );
    expect(ok.status).toBe(200);
    const answered = await answerConsent(origin, ok, { action: "approve", key: readKey });
    expect(answered.location?.host).toBe("127.0.0.1:55123");
    const code = answered.location?.searchParams.get("code") ?? "";
    const t = await tokenRequest(origin, {
      grant_type: "authorization_code",
      client_id: clientId,
      code,
      code_verifier: verifier,
      redirect_uri: "http://127.0.0.1:55123/native-cb",
    });
    expect(t.status).toBe(200);
    for (const other of ["http://127.0.0.1:55123/elsewhere", "http://localhost:55123/native-cb"]) {
      const res = await fetch(authorizeUrl(clientId, challenge, { redirect_uri: other }), { redirect: "manual" });
      expect(res.status).toBe(400);
      expect(res.headers.get("location")).toBeNull();
    }
  });

  it("a key without coding_agent:run never grants it, even to a provisioned client that asks and is ticked", async () => {
    const clientId = await register();
    await serverCli(["oauth", "clients", "allow-coding-agent-run", clientId, "--config", stack.serverConfigFile]);
    const { code, verifier } = await codeFor(readKey, { clientId, codingAgentRun: true });
    const r = await exchange(clientId, code, verifier);
    expect(r.status).toBe(200);
    expect(String(r.body.scope).split(" ").sort()).toEqual(["project:read", "project:write"]);
  });

  it("a tool name that is an Object.prototype member gets a tool-not-found answer, not a 500", async () => {
    const { clientId, code, verifier } = await codeFor(readKey);
    const access = String((await exchange(clientId, code, verifier)).body.access_token);
    for (const name of ["valueOf", "toString", "constructor", "__proto__", "hasOwnProperty"]) {
      const r = await mcpPost(origin, access, { method: "tools/call", params: { name, arguments: {} } });
      expect(r.status, name).toBe(200);
      expect(r.body, name).toMatch(/unknown tool|not found/i);
    }
  });

  it("tokens stop at the next request after the operator revokes the grant, or unprovisions the client", async () => {
    const clientId = await register();
    await serverCli(["oauth", "clients", "allow-coding-agent-run", clientId, "--config", stack.serverConfigFile]);
    const a = await codeFor(runKey, { clientId, codingAgentRun: true });
    const tokens = await exchange(clientId, a.code, a.verifier);
    const access = String(tokens.body.access_token);
    const call = {
      method: "tools/call",
      params: { name: "cancel_coding_agent", arguments: { run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa" } },
    };
    expect((await mcpPost(origin, access, call)).status).toBe(200);
    await serverCli(["oauth", "clients", "disallow-coding-agent-run", clientId, "--config", stack.serverConfigFile]);
    const narrowed = await mcpPost(origin, access, call);
    expect(narrowed.status).toBe(403);
    expect(narrowed.wwwAuthenticate).toContain('error="insufficient_scope"');

    const { stdout } = await serverCli([
      "oauth",
      "grants",
      "list",
      "--client",
      clientId,
      "--json",
      "--config",
      stack.serverConfigFile,
    ]);
    const [grant] = JSON.parse(stdout) as Array<{ grant_id: string }>;
    await serverCli(["oauth", "grants", "revoke", "--id", grant?.grant_id ?? "", "--config", stack.serverConfigFile]);
    expect((await mcpPost(origin, access, { method: "tools/list" })).status).toBe(401);
    const refreshed = await tokenRequest(origin, {
      grant_type: "refresh_token",
      refresh_token: String(tokens.body.refresh_token),
      client_id: clientId,
    });
    expect(refreshed.body.error).toBe("invalid_grant");

    const { stdout: audit } = await serverCli([
      "oauth",
      "clients",
      "show",
      clientId,
      "--config",
      stack.serverConfigFile,
    ]);
    // No token of either kind: its prefix at the start of a value (inside a random id it is chance).
    expect(audit).not.toMatch(/(?<![\w-])(wcoa|wct)_/);
  });

  it("an operator-registered client from the config signs in like any other and is labelled as such", async () => {
    const { challenge, verifier } = pkce();
    const page = await openConsent(authorizeUrl("ops-ide", challenge));
    expect(page.status).toBe(200);
    expect(page.html).toContain("Ops IDE");
    expect(page.html).toContain("Your operator registered this app");
    // Not provisioned: the coding_agent:run line is not offered.
    expect(page.html).not.toContain('name="coding_agent_run"');
    const answered = await answerConsent(origin, page, { action: "approve", key: runKey, codingAgentRun: true });
    const t = await exchange("ops-ide", answered.location?.searchParams.get("code") ?? "", verifier);
    expect(t.status).toBe(200);
    expect(String(t.body.scope).split(" ").sort()).toEqual(["project:read", "project:write"]);
    const { stdout } = await serverCli(["oauth", "clients", "list", "--json", "--config", stack.serverConfigFile]);
    const ops = (
      JSON.parse(stdout) as Array<{ client_id: string; kind: string; allow_coding_agent_run: boolean }>
    ).find((c) => c.client_id === "ops-ide");
    expect(ops).toMatchObject({ kind: "operator", allow_coding_agent_run: false });
  });

  it("dynamic registration is rate-limited per IP", async () => {
    let limited = false;
    for (let i = registrations; i < REGISTRATIONS_PER_HOUR + 2 && !limited; i++) {
      const res = await fetch(`${origin}/register`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ redirect_uris: [REDIRECT], token_endpoint_auth_method: "none" }),
      });
      limited = res.status === 429;
      if (!limited) expect(res.status).toBe(201);
    }
    expect(limited).toBe(true);
  });
});

describe("concurrent wrong keys at the consent page, held together at the lookup", () => {
  let held: ProcStack;

  beforeAll(async () => {
    held = await oauthStack(HOLD_KEY_LOOKUPS);
  }, 60_000);

  afterAll(async () => {
    await held?.stop();
  }, 60_000);

  it("counts each before looking it up: only the bound reach the lookup and 401, the rest are 429", async () => {
    const server = held.serverChild;
    if (server === null) throw new Error("no server child");
    const at = `http://127.0.0.1:${held.port}`;
    const page = await openConsent(authorizeUrl("ops-ide", pkce().challenge, {}, at));
    expect(page.status).toBe(200);
    const total = 10 * MAX_KEY_ATTEMPTS;
    // Every key that passes the bound's check waits at the lookup until all have answered or arrived there.
    const { answers, held: atLookup } = await heldRace(server, total, () =>
      answerConsent(at, page, { action: "approve", key: `wct_${randomBytes(32).toString("base64url")}` }),
    );
    expect(atLookup).toBe(MAX_KEY_ATTEMPTS);
    expect(answers.filter((a) => a.status === 401).length).toBe(MAX_KEY_ATTEMPTS);
    expect(answers.filter((a) => a.status === 429).length).toBe(total - MAX_KEY_ATTEMPTS);
  }, 120_000);
});
