/**
 * The Server's real OAuth flow without a browser, for the hardening fuzz:
 * dynamic client registration (RFC 7591), /authorize → the consent form
 * answered over HTTP with an operator-issued access key (coding_agent:run
 * ticked or not), PKCE S256, and the code exchanged at /token. The consent
 * form helpers are the Server tests' own (packages/server/test/support/oauth.ts).
 */
import { createHash, randomBytes } from "node:crypto";
import { answerConsent, openConsent, tokenRequest } from "../../../../packages/server/test/support/oauth.js";

export const OAUTH_REDIRECT = "https://app.example/callback";

export interface IssuedTokens {
  clientId: string;
  access: string;
  refresh: string;
  /** The scopes the Server granted (space-separated), which may be fewer than requested. */
  scope: string;
}

/** A public client registered through /register; returns its client_id. */
export async function registerClient(origin: string, name: string): Promise<string> {
  const res = await fetch(`${origin}/register`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ client_name: name, redirect_uris: [OAUTH_REDIRECT], token_endpoint_auth_method: "none" }),
  });
  if (res.status !== 201) throw new Error(`register: HTTP ${res.status} ${await res.text()}`);
  return ((await res.json()) as { client_id: string }).client_id;
}

/** Authorize `clientId` for `scope` with the access `key`, consent, and redeem the code with its PKCE verifier. */
export async function authorizeAndRedeem(
  origin: string,
  opts: { clientId: string; key: string; scope: string; codingAgentRun: boolean },
): Promise<IssuedTokens> {
  const verifier = randomBytes(32).toString("base64url");
  const u = new URL(`${origin}/authorize`);
  for (const [k, v] of Object.entries({
    response_type: "code",
    client_id: opts.clientId,
    redirect_uri: OAUTH_REDIRECT,
    code_challenge: createHash("sha256").update(verifier).digest("base64url"),
    code_challenge_method: "S256",
    scope: opts.scope,
    state: randomBytes(8).toString("hex"),
    resource: `${origin}/mcp`,
  }))
    u.searchParams.set(k, v);
  const page = await openConsent(u);
  if (page.status !== 200) throw new Error(`authorize: HTTP ${page.status}`);
  const answered = await answerConsent(origin, page, {
    action: "approve",
    key: opts.key,
    codingAgentRun: opts.codingAgentRun,
  });
  const code = answered.location?.searchParams.get("code");
  if (!code) throw new Error(`consent: no code (HTTP ${answered.status})`);
  const t = await tokenRequest(origin, {
    grant_type: "authorization_code",
    client_id: opts.clientId,
    code,
    code_verifier: verifier,
    redirect_uri: OAUTH_REDIRECT,
  });
  if (t.status !== 200) throw new Error(`token: HTTP ${t.status} ${JSON.stringify(t.body)}`);
  return {
    clientId: opts.clientId,
    access: String(t.body.access_token),
    refresh: String(t.body.refresh_token),
    scope: String(t.body.scope),
  };
}

/** RFC 7009 revocation of one token by its client; returns the HTTP status. */
export async function revokeToken(origin: string, clientId: string, token: string): Promise<number> {
  const res = await fetch(`${origin}/revoke`, {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({ token, client_id: clientId }),
  });
  await res.text();
  return res.status;
}
