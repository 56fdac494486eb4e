/**
 * OAuth test support: a self-signed loopback https host for client metadata
 * documents, in-test `OAuthClientProvider`s for the SDK clients (v1 and v2), the consent
 * form driven over plain HTTP, and the operator CLI run as a child process.
 */
import { execFile, execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer as createHttpsServer, type Server as HttpsServer } from "node:https";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { promisify } from "node:util";
import type {
  OAuthClientMetadata as OAuthClientMetadataV2,
  OAuthClientProvider as OAuthClientProviderV2,
  OAuthDiscoveryState,
  StoredOAuthClientInformation,
  StoredOAuthTokens,
} from "@modelcontextprotocol/client";
import type { OAuthClientProvider } from "@modelcontextprotocol/sdk/client/auth.js";
import type {
  OAuthClientInformationMixed,
  OAuthClientMetadata,
  OAuthTokens,
} from "@modelcontextprotocol/sdk/shared/auth.js";
import { SERVER_BIN } from "../../../../scripts/test-support/index.js";

const run = promisify(execFile);

export interface TestCert {
  keyFile: string;
  certFile: string;
  key: string;
  cert: string;
}

/** A throwaway self-signed certificate for 127.0.0.1 (openssl). */
export function makeLoopbackCert(dir: string): TestCert {
  const keyFile = join(dir, "cimd-key.pem");
  const certFile = join(dir, "cimd-cert.pem");
  execFileSync(
    "openssl",
    [
      "req",
      "-x509",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-nodes",
      "-keyout",
      keyFile,
      "-out",
      certFile,
      "-days",
      "2",
      "-subj",
      "/CN=127.0.0.1",
      "-addext",
      "subjectAltName=IP:127.0.0.1",
    ],
    { stdio: "ignore" },
  );
  return { keyFile, certFile, key: readFileSync(keyFile, "utf8"), cert: readFileSync(certFile, "utf8") };
}

export type Route = (req: import("node:http").IncomingMessage, res: import("node:http").ServerResponse) => void;

/** An https server on 127.0.0.1 answering each path with its route. */
export async function startHttpsHost(
  cert: TestCert,
  routes: Record<string, Route>,
): Promise<{ server: HttpsServer; origin: string; close(): Promise<void> }> {
  const server = createHttpsServer({ key: cert.key, cert: cert.cert }, (req, res) => {
    const route = routes[(req.url ?? "/").split("?")[0] ?? "/"];
    if (route) route(req, res);
    else res.writeHead(404).end();
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const origin = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    server,
    origin,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

/** The SDK client's OAuth provider, kept in memory; `authUrl` is where it would send the person. */
export class TestOAuthProvider implements OAuthClientProvider {
  authUrl: URL | null = null;
  #client: OAuthClientInformationMixed | undefined;
  #tokens: OAuthTokens | undefined;
  #verifier = "";
  readonly clientMetadataUrl?: string;

  constructor(
    readonly redirectUri: string,
    opts: { clientMetadataUrl?: string; name?: string } = {},
  ) {
    if (opts.clientMetadataUrl !== undefined) this.clientMetadataUrl = opts.clientMetadataUrl;
    this.clientMetadata = {
      client_name: opts.name ?? "SDK test client",
      redirect_uris: [redirectUri],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      token_endpoint_auth_method: "none",
    };
  }

  readonly clientMetadata: OAuthClientMetadata;

  get redirectUrl(): string {
    return this.redirectUri;
  }

  state(): string {
    return "st-123";
  }

  clientInformation(): OAuthClientInformationMixed | undefined {
    return this.#client;
  }

  saveClientInformation(info: OAuthClientInformationMixed): void {
    this.#client = info;
  }

  tokens(): OAuthTokens | undefined {
    return this.#tokens;
  }

  saveTokens(tokens: OAuthTokens): void {
    this.#tokens = tokens;
  }

  redirectToAuthorization(url: URL): void {
    this.authUrl = url;
  }

  saveCodeVerifier(verifier: string): void {
    this.#verifier = verifier;
  }

  codeVerifier(): string {
    return this.#verifier;
  }
}

/**
 * The SDK v2 client's (`@modelcontextprotocol/client`) OAuth provider, kept in memory. Its client metadata leaves
 * `application_type` and `grant_types` to the SDK's defaults (SEP-837: `native` for a loopback redirect URI); the
 * discovery state is kept so `finishAuth` on the same provider can check the callback's `iss` (RFC 9207).
 */
export class TestOAuthProviderV2 implements OAuthClientProviderV2 {
  authUrl: URL | null = null;
  /** The `state` this provider sends; the callback must carry it back. */
  readonly stateValue = randomBytes(16).toString("base64url");
  readonly clientMetadata: OAuthClientMetadataV2;
  readonly clientMetadataUrl?: string;
  #client: StoredOAuthClientInformation | undefined;
  #tokens: StoredOAuthTokens | undefined;
  #verifier = "";
  #discovery: OAuthDiscoveryState | undefined;

  constructor(
    readonly redirectUri: string,
    opts: { clientMetadataUrl?: string; name?: string } = {},
  ) {
    if (opts.clientMetadataUrl !== undefined) this.clientMetadataUrl = opts.clientMetadataUrl;
    this.clientMetadata = {
      client_name: opts.name ?? "SDK v2 test client",
      redirect_uris: [redirectUri],
      token_endpoint_auth_method: "none",
    };
  }

  get redirectUrl(): string {
    return this.redirectUri;
  }

  state(): string {
    return this.stateValue;
  }

  clientInformation(): StoredOAuthClientInformation | undefined {
    return this.#client;
  }

  saveClientInformation(info: StoredOAuthClientInformation): void {
    this.#client = info;
  }

  tokens(): StoredOAuthTokens | undefined {
    return this.#tokens;
  }

  saveTokens(tokens: StoredOAuthTokens): void {
    this.#tokens = tokens;
  }

  redirectToAuthorization(url: URL): void {
    this.authUrl = url;
  }

  saveCodeVerifier(verifier: string): void {
    this.#verifier = verifier;
  }

  codeVerifier(): string {
    return this.#verifier;
  }

  saveDiscoveryState(state: OAuthDiscoveryState): void {
    this.#discovery = state;
  }

  discoveryState(): OAuthDiscoveryState | undefined {
    return this.#discovery;
  }
}

export interface ConsentPage {
  status: number;
  html: string;
  requestId: string;
  csrf: string;
  cookie: string;
}

/** GET the consent page of an authorization URL and pick out its form fields and CSRF cookie. */
export async function openConsent(authUrl: URL | string): Promise<ConsentPage> {
  const res = await fetch(authUrl, { redirect: "manual" });
  const html = await res.text();
  const field = (name: string) => new RegExp(`name="${name}" value="([^"]*)"`).exec(html)?.[1] ?? "";
  const setCookie = res.headers.get("set-cookie") ?? "";
  return {
    status: res.status,
    html,
    requestId: field("request_id"),
    csrf: field("csrf"),
    cookie: setCookie.split(";")[0] ?? "",
  };
}

function unescapeHtml(text: string): string {
  return text.replace(/&#(\d+);/g, (_m, n: string) => String.fromCharCode(Number(n))).replaceAll("&amp;", "&");
}

/** One POST of the consent form. `location`: the redirect, or the result page's way back to the client. */
async function postConsent(
  origin: string,
  page: ConsentPage,
  fields: Record<string, string>,
  cookie: string,
): Promise<{ status: number; location: URL | null; html: string }> {
  const res = await fetch(`${origin}/oauth/consent`, {
    method: "POST",
    redirect: "manual",
    headers: { "content-type": "application/x-www-form-urlencoded", cookie },
    body: new URLSearchParams({ request_id: page.requestId, ...fields }),
  });
  const html = await res.text();
  const header = res.headers.get("location");
  const link = /<a class="button" id="continue" href="([^"]*)"/.exec(html)?.[1];
  const location = header ? new URL(header) : link ? new URL(unescapeHtml(link)) : null;
  return { status: res.status, location, html };
}

/**
 * Answer a consent page over HTTP as a person does: `approve` with a key first continues to the
 * review step (returned as `review`, or the step's refusal page), then allows, ticking
 * coding_agent:run when asked to. Returns the last answer's status, Location (or the result page's
 * link back to the client) and body.
 */
export async function answerConsent(
  origin: string,
  page: ConsentPage,
  answer: { action: "approve" | "deny"; key?: string; codingAgentRun?: boolean; csrf?: string; cookie?: string },
): Promise<{ status: number; location: URL | null; html: string; review?: string }> {
  const csrf = answer.csrf ?? page.csrf;
  const cookie = answer.cookie ?? page.cookie;
  if (answer.action === "deny") return postConsent(origin, page, { csrf, action: "deny" }, cookie);
  const review = await postConsent(origin, page, { csrf, action: "review", key: answer.key ?? "" }, cookie);
  if (review.status !== 200) return review;
  const allow: Record<string, string> = { csrf, action: "approve" };
  if (answer.codingAgentRun) allow.coding_agent_run = "yes";
  return { ...(await postConsent(origin, page, allow, cookie)), review: review.html };
}

/** `webcodex-server <args>` against a config; stdout and stderr. */
export async function serverCli(args: string[]): Promise<{ stdout: string; stderr: string }> {
  return run(process.execPath, [SERVER_BIN, ...args], { env: { ...process.env } });
}

/** Issue an access key with `webcodex-server token issue` (the way an operator does). */
export async function issueKey(
  config: string,
  principal: string,
  scopes: string[],
  projects: string[],
): Promise<string> {
  const args = ["token", "issue", "--config", config, "--principal", principal, "--json"];
  for (const s of scopes) args.push("--scope", s);
  for (const p of projects) args.push("--project", p);
  if (scopes.includes("coding_agent:run")) args.push("--allow-coding-agent-run");
  const { stdout } = await serverCli(args);
  return (JSON.parse(stdout) as { token: string }).token;
}

/** POST /token with a form body. */
export async function tokenRequest(
  origin: string,
  form: Record<string, string>,
): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${origin}/token`, {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams(form),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

/** One JSON-RPC POST to /mcp with a bearer token. */
export async function mcpPost(
  origin: string,
  token: string | null,
  message: Record<string, unknown>,
): Promise<{ status: number; wwwAuthenticate: string | null; body: string }> {
  const res = await fetch(`${origin}/mcp`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": "2025-11-25",
      ...(token ? { authorization: `Bearer ${token}` } : {}),
    },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, ...message }),
  });
  return { status: res.status, wwwAuthenticate: res.headers.get("www-authenticate"), body: await res.text() };
}

/** The result of `OAuthStore.createGrantWithCode`, which is null only when the client was revoked. */
export async function created<T>(grant: Promise<T | null>): Promise<T> {
  const value = await grant;
  if (value === null) throw new Error("createGrantWithCode refused: the client is revoked");
  return value;
}
