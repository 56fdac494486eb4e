/**
 * The consent step in a real headless browser: the Chromium that the
 * @sparticuz/chromium devDependency ships (support/browser.ts), driven by playwright-core,
 * against a real Server child process. The browser types the key, reviews
 * what Allow grants, ticks or leaves coding_agent:run, approves or denies;
 * the client's loopback redirect URI receives the result and the test
 * exchanges the code. The pages are also checked at phone width (no word
 * broken mid-word), in dark mode, and with JavaScript off. The SDK v2 client
 * (`@modelcontextprotocol/client`) and its OAuth provider go through the same
 * page twice: registering dynamically (SEP-837 `application_type`) and with a
 * client ID metadata document served on loopback https.
 *
 * WEBCODEX_CONSENT_SCREENSHOT=FILE also saves a screenshot of the page (the
 * README's docs/oauth-consent.png is made this way).
 */
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  Client as ClientV2,
  type FetchLike,
  StreamableHTTPClientTransport as TransportV2,
  UnauthorizedError as UnauthorizedErrorV2,
} from "@modelcontextprotocol/client";
import { type Browser, chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { browserLaunchOptions } from "../support/browser.js";
import {
  issueKey,
  makeLoopbackCert,
  serverCli,
  startHttpsHost,
  TestOAuthProviderV2,
  tokenRequest,
} from "../support/oauth.js";
import { ProcStack } from "../support/proc-stack.js";

let stack: ProcStack;
let origin: string;
let browser: Browser;
let callback: Server;
let redirectUri: string;
let runKey: string;
let clientId: string;
let certDir: string;
let metadataHost: Awaited<ReturnType<typeof startHttpsHost>>;
const arrivals: URL[] = [];
const waiters: Array<(u: URL) => void> = [];

beforeAll(async () => {
  callback = createServer((req, res) => {
    const u = new URL(req.url ?? "/", "http://127.0.0.1");
    res.writeHead(200, { "content-type": "text/plain" }).end("back at the client");
    if (u.pathname !== "/callback") return; // the browser also asks for /favicon.ico
    const w = waiters.shift();
    if (w) w(u);
    else arrivals.push(u);
  });
  await new Promise<void>((r) => callback.listen(0, "127.0.0.1", r));
  redirectUri = `http://127.0.0.1:${(callback.address() as AddressInfo).port}/callback`;
  // The SDK v2 client's metadata document, on loopback https (the Server trusts its certificate and allows
  // loopback metadata URLs by the dev setting).
  certDir = mkdtempSync(join(tmpdir(), "wc-browser-cimd-"));
  const cert = makeLoopbackCert(certDir);
  metadataHost = await startHttpsHost(cert, {
    "/v2-client.json": (_req, res) => {
      res.writeHead(200, { "content-type": "application/json" }).end(
        JSON.stringify({
          client_id: `${metadataHost.origin}/v2-client.json`,
          client_name: "SDK v2 metadata-document app",
          redirect_uris: [redirectUri],
          grant_types: ["authorization_code", "refresh_token"],
          response_types: ["code"],
          token_endpoint_auth_method: "none",
          application_type: "native",
        }),
      );
    },
  });
  stack = await new ProcStack({
    runners: [],
    server: "child",
    serverEnv: { NODE_EXTRA_CA_CERTS: cert.certFile },
    serverSection: (port) => `public_url = "http://127.0.0.1:${port}"`,
    extraServerToml: "[oauth]\nenabled = true\ndev_allow_loopback_client_metadata = true\n",
  }).init();
  origin = `http://127.0.0.1:${stack.port}`;
  runKey = await issueKey(stack.serverConfigFile, "alice", ["coding_agent:run", "project:write", "project:read"], []);
  const reg = await fetch(`${origin}/register`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      client_name: "Browser test app",
      redirect_uris: [redirectUri],
      token_endpoint_auth_method: "none",
    }),
  });
  clientId = ((await reg.json()) as { client_id: string }).client_id;
  await serverCli(["oauth", "clients", "allow-coding-agent-run", clientId, "--config", stack.serverConfigFile]);
  browser = await chromium.launch(await browserLaunchOptions());
}, 90_000);

afterAll(async () => {
  await browser?.close();
  await stack?.stop();
  await new Promise<void>((r) => (callback ? callback.close(() => r()) : r()));
  await metadataHost?.close();
  if (certDir) rmSync(certDir, { recursive: true, force: true });
});

function nextArrival(): Promise<URL> {
  const early = arrivals.shift();
  if (early) return Promise.resolve(early);
  return new Promise((r) => waiters.push(r));
}

function authorizeUrl(challenge: string, client = clientId): string {
  const u = new URL(`${origin}/authorize`);
  u.search = new URLSearchParams({
    response_type: "code",
    client_id: client,
    redirect_uri: redirectUri,
    code_challenge: challenge,
    code_challenge_method: "S256",
    scope: "project:read project:write coding_agent:run",
    state: "browser-state",
    resource: `${origin}/mcp`,
  }).toString();
  return u.href;
}

const PHONE = { width: 360, height: 780 };

async function openConsentPage(
  opts: { client?: string; colorScheme?: "light" | "dark"; javaScriptEnabled?: boolean } = {},
): Promise<{ page: Page; verifier: string; requests: string[] }> {
  const verifier = randomBytes(32).toString("base64url");
  const challenge = createHash("sha256").update(verifier).digest("base64url");
  const context = await browser.newContext({
    viewport: PHONE,
    colorScheme: opts.colorScheme ?? "light",
    javaScriptEnabled: opts.javaScriptEnabled ?? true,
  });
  const page = await context.newPage();
  const requests: string[] = [];
  page.on("request", (r) => requests.push(r.url()));
  const response = await page.goto(authorizeUrl(challenge, opts.client));
  expect(response?.status()).toBe(200);
  return { page, verifier, requests };
}

/**
 * Words (outside `.id` elements: ids, URLs, commands) that the layout broke across lines, and
 * whether anything overflows the viewport sideways.
 */
/** Run in the page (as source text: the tests compile without the DOM library). */
const LAYOUT_PROBLEMS = `(() => {
  const broken = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement && n.parentElement.closest(".id, head, style")) continue;
    const text = n.textContent || "";
    for (const m of text.matchAll(/\\S+/g)) {
      const r = document.createRange();
      r.setStart(n, m.index);
      r.setEnd(n, m.index + m[0].length);
      const lines = new Set([...r.getClientRects()].map((x) => Math.round(x.top)));
      if (lines.size > 1) broken.push(m[0]);
    }
  }
  return { broken, overflow: document.documentElement.scrollWidth > window.innerWidth };
})()`;

async function layoutProblems(page: Page): Promise<{ broken: string[]; overflow: boolean }> {
  return page.evaluate(LAYOUT_PROBLEMS) as Promise<{ broken: string[]; overflow: boolean }>;
}

async function exchange(code: string, verifier: string, client = clientId) {
  return tokenRequest(origin, {
    grant_type: "authorization_code",
    client_id: client,
    code,
    code_verifier: verifier,
    redirect_uri: redirectUri,
  });
}

describe("consent in a real browser", () => {
  it("shows the client, its redirect host and an unchecked coding_agent:run line; loads nothing from elsewhere", async () => {
    const { page, requests } = await openConsentPage();
    await expect(page.locator("h1").textContent()).resolves.toContain("Browser test app");
    await expect(page.locator("body").textContent()).resolves.toContain(new URL(redirectUri).host);
    // Operator hints live in the small "for operators" line only.
    await expect(page.locator(".ops").textContent()).resolves.toContain("webcodex-server token issue");
    const screenshot = process.env.WEBCODEX_CONSENT_SCREENSHOT;
    if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
    await page.fill("#key", runKey);
    await page.click('button[value="review"]');
    const tick = page.locator('input[name="coding_agent_run"]');
    await expect(tick.isChecked()).resolves.toBe(false);
    expect(requests.every((u) => u.startsWith(origin))).toBe(true);
    await page.context().close();
  });

  it("types the key, reviews, ticks coding_agent:run and approves: the result page and the token carry it", async () => {
    const { page, verifier } = await openConsentPage();
    await page.fill("#key", runKey);
    await page.click('button[value="review"]');
    await page.check('input[name="coding_agent_run"]');
    await page.click('button[value="approve"]');
    const result = (await page.locator("main").textContent()) ?? "";
    expect(result).toContain("is connected");
    expect(result).toContain("Start, watch and stop coding agents");
    expect(result).toContain("30 days");
    const back = nextArrival();
    await page.click("#continue");
    const u = await back;
    expect(u.searchParams.get("state")).toBe("browser-state");
    const t = await exchange(u.searchParams.get("code") ?? "", verifier);
    expect(t.status).toBe(200);
    expect(String(t.body.scope).split(" ").sort()).toEqual(["coding_agent:run", "project:read", "project:write"]);
    await page.context().close();
  });

  it("leaves coding_agent:run unticked and approves: the token does not carry it", async () => {
    const { page, verifier } = await openConsentPage();
    await page.fill("#key", runKey);
    await page.click('button[value="review"]');
    await page.click('button[value="approve"]');
    expect(await page.locator("main").textContent()).not.toContain("Start, watch and stop coding agents");
    const back = nextArrival();
    await page.click("#continue");
    const u = await back;
    const t = await exchange(u.searchParams.get("code") ?? "", verifier);
    expect(String(t.body.scope).split(" ").sort()).toEqual(["project:read", "project:write"]);
    await page.context().close();
  });

  it("denies: the client gets access_denied and no code", async () => {
    const { page } = await openConsentPage();
    const back = nextArrival();
    await page.click('button[value="deny"]');
    const u = await back;
    expect(u.searchParams.get("error")).toBe("access_denied");
    expect(u.searchParams.get("code")).toBeNull();
    await page.context().close();
  });

  it("a wrong key keeps the person on the page with a message, and the right key then works", async () => {
    const { page, verifier } = await openConsentPage();
    await page.fill("#key", "wct_not-the-key");
    await page.click('button[value="review"]');
    await expect(page.locator('[role="alert"]').textContent()).resolves.toContain("not valid");
    await page.fill("#key", runKey);
    await page.click('button[value="review"]');
    await page.click('button[value="approve"]');
    const back = nextArrival();
    await page.click("#continue");
    const u = await back;
    expect((await exchange(u.searchParams.get("code") ?? "", verifier)).status).toBe(200);
    await page.context().close();
  });

  it("at phone width in dark mode and without JavaScript: no word broken mid-word, operator hint with the client id, the flow completes", async () => {
    const reg = await fetch(`${origin}/register`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        client_name: "Unprovisioned assistant with a rather long name",
        redirect_uris: [redirectUri],
        token_endpoint_auth_method: "none",
      }),
    });
    const other = ((await reg.json()) as { client_id: string }).client_id;
    const { page, verifier } = await openConsentPage({ client: other, colorScheme: "dark", javaScriptEnabled: false });
    const background = await page.evaluate("getComputedStyle(document.body).backgroundColor");
    expect(background).toBe("rgb(13, 17, 23)");
    expect(await layoutProblems(page)).toEqual({ broken: [], overflow: false });
    const ops = (await page.locator(".ops").allTextContents()).join(" ");
    expect(ops).toContain(`webcodex-server oauth clients allow-coding-agent-run ${other}`);
    expect(await page.locator("main").textContent()).toContain("not allowed to do that here");

    await page.fill("#key", runKey);
    await page.click('button[value="review"]');
    const review = (await page.locator("main").textContent()) ?? "";
    expect(review).toContain("See which of your projects it can use");
    expect(review).toContain("For how long");
    expect(await page.locator('input[name="coding_agent_run"]').count()).toBe(0);
    expect(await layoutProblems(page)).toEqual({ broken: [], overflow: false });
    const back = nextArrival();
    await page.click('button[value="approve"]');
    expect(await page.locator("main").textContent()).toContain(`allow-coding-agent-run ${other}`);
    expect(await layoutProblems(page)).toEqual({ broken: [], overflow: false });
    // No click: the result page's refresh takes the browser back without JavaScript.
    const u = await back;
    expect(u.searchParams.get("iss")).toBe(origin);
    const t = await exchange(u.searchParams.get("code") ?? "", verifier, other);
    expect(String(t.body.scope).split(" ").sort()).toEqual(["project:read", "project:write"]);
    await page.context().close();
  });
});

/** What a person does on the consent page for `authUrl`: type the key, Continue, Allow, back to the client. */
async function allowInBrowser(authUrl: URL): Promise<{ arrival: URL; heading: string }> {
  const context = await browser.newContext({ viewport: PHONE });
  const page = await context.newPage();
  expect((await page.goto(authUrl.href))?.status()).toBe(200);
  const heading = (await page.locator("h1").textContent()) ?? "";
  await page.fill("#key", runKey);
  await page.click('button[value="review"]');
  await page.click('button[value="approve"]');
  const back = nextArrival();
  await page.click("#continue");
  const arrival = await back;
  await context.close();
  return { arrival, heading };
}

/** A fetch for the SDK v2 transport that notes the JSON body of every registration it sends. */
function recordingRegistrations(): { fetch: FetchLike; registrations: Array<Record<string, unknown>> } {
  const registrations: Array<Record<string, unknown>> = [];
  return {
    registrations,
    fetch: (url, init) => {
      if (new URL(String(url)).pathname === "/register" && typeof init?.body === "string")
        registrations.push(JSON.parse(init.body) as Record<string, unknown>);
      return fetch(url, init);
    },
  };
}

/** Connects the SDK v2 client until its provider wants a person's consent; returns the transport to finish on. */
async function startV2Authorization(provider: TestOAuthProviderV2, fetchFn: FetchLike): Promise<TransportV2> {
  const transport = new TransportV2(new URL(`${origin}/mcp`), { authProvider: provider, fetch: fetchFn });
  await expect(new ClientV2({ name: "v2-oauth-test", version: "1.0.0" }).connect(transport)).rejects.toBeInstanceOf(
    UnauthorizedErrorV2,
  );
  if (!provider.authUrl) throw new Error("the SDK v2 client did not start an authorization");
  return transport;
}

/** The SDK v2 client connected with the provider's tokens: the tools it sees. */
async function v2ToolNames(provider: TestOAuthProviderV2): Promise<string[]> {
  const client = new ClientV2({ name: "v2-oauth-test", version: "1.0.0" });
  await client.connect(new TransportV2(new URL(`${origin}/mcp`), { authProvider: provider }));
  try {
    return (await client.listTools()).tools.map((t) => t.name);
  } finally {
    await client.close();
  }
}

describe("the SDK v2 client's OAuth provider, consent in the browser", () => {
  it("registers dynamically as a native app (SEP-837 application_type, loopback redirect), is allowed, and connects", async () => {
    const { fetch: fetchFn, registrations } = recordingRegistrations();
    const provider = new TestOAuthProviderV2(redirectUri, { name: "SDK v2 native app" });
    const transport = await startV2Authorization(provider, fetchFn);
    // The SDK derived application_type from the loopback redirect URI; the Server accepted it.
    expect(registrations).toHaveLength(1);
    expect(registrations[0]).toMatchObject({ application_type: "native", redirect_uris: [redirectUri] });
    const registered = provider.clientInformation()?.client_id ?? "";
    expect(registered).not.toBe("");
    expect(provider.authUrl?.searchParams.get("client_id")).toBe(registered);
    expect(provider.authUrl?.searchParams.get("resource")).toBe(`${origin}/mcp`);

    const { arrival, heading } = await allowInBrowser(provider.authUrl!);
    expect(heading).toContain("SDK v2 native app");
    expect(arrival.searchParams.get("state")).toBe(provider.stateValue);
    // finishAuth checks iss against the issuer it discovered (RFC 9207) before it redeems the code.
    await transport.finishAuth(arrival.searchParams);
    expect(provider.tokens()?.access_token).toMatch(/^wcoa_/);
    expect(provider.tokens()?.scope?.split(" ").sort()).toEqual(["project:read", "project:write"]);
    expect(await v2ToolNames(provider)).toContain("observe_coding_agent");
  });

  it("uses a client ID metadata document instead of registering, is allowed, and connects", async () => {
    const { fetch: fetchFn, registrations } = recordingRegistrations();
    const metadataUrl = `${metadataHost.origin}/v2-client.json`;
    const provider = new TestOAuthProviderV2(redirectUri, { clientMetadataUrl: metadataUrl, name: "unused name" });
    const transport = await startV2Authorization(provider, fetchFn);
    expect(registrations).toEqual([]);
    expect(provider.authUrl?.searchParams.get("client_id")).toBe(metadataUrl);

    const { arrival, heading } = await allowInBrowser(provider.authUrl!);
    // The page names the client as its metadata document does.
    expect(heading).toContain("SDK v2 metadata-document app");
    expect(arrival.searchParams.get("iss")).toBe(origin);
    await transport.finishAuth(arrival.searchParams);
    expect(provider.tokens()?.scope?.split(" ").sort()).toEqual(["project:read", "project:write"]);
    expect(await v2ToolNames(provider)).toContain("observe_coding_agent");
    const { stdout } = await serverCli(["oauth", "clients", "show", metadataUrl, "--config", stack.serverConfigFile]);
    expect(stdout).toContain("cimd");
  });
});
