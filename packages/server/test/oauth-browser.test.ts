/**
 * The consent step in a real headless browser: the Chromium that the
 * @sparticuz/chromium devDependency ships (support/browser.ts), driven by playwright-core,
 * against a real Server child process. The browser types the key, ticks or
 * leaves coding_agent:run, approves or denies; the client's loopback
 * redirect URI receives the result and the test exchanges the code.
 *
 * WEBCODEX_CONSENT_SCREENSHOT=FILE also saves a screenshot of the page (the
 * README's docs/oauth-consent.png is made this way).
 */
import { createHash, randomBytes } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { type Browser, chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { browserLaunchOptions } from "./support/browser.js";
import { issueKey, serverCli, tokenRequest } from "./support/oauth.js";
import { ProcStack } from "./support/proc-stack.js";

let stack: ProcStack;
let origin: string;
let browser: Browser;
let callback: Server;
let redirectUri: string;
let runKey: string;
let clientId: string;
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
  stack = await new ProcStack({
    runners: [],
    server: "child",
    serverSection: (port) => `public_url = "http://127.0.0.1:${port}"`,
    extraServerToml: "[oauth]\nenabled = true\n",
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
}, 60_000);

function nextArrival(): Promise<URL> {
  const early = arrivals.shift();
  if (early) return Promise.resolve(early);
  return new Promise((r) => waiters.push(r));
}

function authorizeUrl(challenge: string): string {
  const u = new URL(`${origin}/authorize`);
  u.search = new URLSearchParams({
    response_type: "code",
    client_id: clientId,
    redirect_uri: redirectUri,
    code_challenge: challenge,
    code_challenge_method: "S256",
    scope: "project:read project:write coding_agent:run",
    state: "browser-state",
    resource: `${origin}/mcp`,
  }).toString();
  return u.href;
}

async function openConsentPage(): Promise<{ page: Page; verifier: string; requests: string[] }> {
  const verifier = randomBytes(32).toString("base64url");
  const challenge = createHash("sha256").update(verifier).digest("base64url");
  const context = await browser.newContext({ viewport: { width: 390, height: 844 } });
  const page = await context.newPage();
  const requests: string[] = [];
  page.on("request", (r) => requests.push(r.url()));
  const response = await page.goto(authorizeUrl(challenge));
  expect(response?.status()).toBe(200);
  return { page, verifier, requests };
}

async function exchange(code: string, verifier: string) {
  return tokenRequest(origin, {
    grant_type: "authorization_code",
    client_id: clientId,
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
    const tick = page.locator('input[name="coding_agent_run"]');
    await expect(tick.isChecked()).resolves.toBe(false);
    await expect(page.locator("body").textContent()).resolves.toContain("webcodex-server token issue");
    const screenshot = process.env.WEBCODEX_CONSENT_SCREENSHOT;
    if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
    expect(requests.every((u) => u.startsWith(origin))).toBe(true);
    await page.context().close();
  });

  it("types the key, ticks coding_agent:run and approves: the client's token carries it", async () => {
    const { page, verifier } = await openConsentPage();
    await page.fill("#key", runKey);
    await page.check('input[name="coding_agent_run"]');
    const back = nextArrival();
    await page.click('button[value="approve"]');
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
    const back = nextArrival();
    await page.click('button[value="approve"]');
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
    await page.click('button[value="approve"]');
    await expect(page.locator('[role="alert"]').textContent()).resolves.toContain("not valid");
    await page.fill("#key", runKey);
    const back = nextArrival();
    await page.click('button[value="approve"]');
    const u = await back;
    expect((await exchange(u.searchParams.get("code") ?? "", verifier)).status).toBe(200);
    await page.context().close();
  });
});
