/**
 * Regenerates docs/console-desktop.png (1280 px wide, light) and docs/console-phone.png (390 px wide, dark):
 * the operator console against a real Server child process, two Runners (one stopped), the fake agent, a few
 * runs and an OAuth grant. Run with `npm run screenshots`.
 */
import { createHash, randomBytes } from "node:crypto";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { expect, it } from "vitest";
import { browserLaunchOptions } from "../../packages/server/test/support/browser.js";
import { answerConsent, issueKey, openConsent, tokenRequest } from "../../packages/server/test/support/oauth.js";
import { okValue, ProcStack } from "../../packages/server/test/support/proc-stack.js";
import { REPO_ROOT } from "../test-support/index.js";

const DOCS = join(REPO_ROOT, "docs");
const REDIRECT = "https://assistant.example/oauth/callback";
/** How long the page may take to show the last change before the picture is taken. */
const SETTLE_MS = 2_500;

it("regenerates the console screenshots in docs/", async () => {
  const stack = await new ProcStack({
    runners: [
      { id: "build-01", projects: ["demo", "website"] },
      { id: "build-02", projects: ["infra"] },
    ],
    server: "child",
    serverSection: (port) => `public_url = "http://127.0.0.1:${port}"`,
    extraServerToml: "[oauth]\nenabled = true\n",
    extraScopes: ["operator:read"],
  }).init();
  const browser = await chromium.launch(await browserLaunchOptions());
  try {
    const origin = `http://127.0.0.1:${stack.port}`;
    await stack.startRunner("build-01");
    const key = await issueKey(stack.serverConfigFile, "alice", ["operator:read"], []);
    const runKey = await issueKey(stack.serverConfigFile, "bob", ["project:read"], []);
    for (const [i, prompt] of ["scenario: tools", "scenario: hello", "scenario: tools"].entries()) {
      const started = okValue(
        await stack.start(i === 1 ? "bob" : "alice", {
          project_id: i === 2 ? "website" : "demo",
          provider_id: "fake",
          idempotency_key: `shot-${i}`,
          prompt,
        }),
      );
      await stack.untilTerminal(started.run_id, i === 1 ? "bob" : "alice");
    }
    const slow = okValue(
      await stack.start("alice", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: "shot-slow",
        prompt: "scenario: slow interval_ms=500 count=600",
      }),
    );
    // Two MCP calls for the audit: one answered, one refused (an unknown run).
    const mcp = await stack.mcp("alice");
    await mcp.callTool({ name: "observe_coding_agent", arguments: { run_id: slow.run_id } });
    await mcp.callTool({
      name: "observe_coding_agent",
      arguments: { run_id: "wc_agent_run_nosuchrun00000000000000000" },
    });
    // A Claude-like client with a grant, so the OAuth table has a row to revoke.
    const reg = await fetch(`${origin}/register`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ client_name: "Assistant", redirect_uris: [REDIRECT], token_endpoint_auth_method: "none" }),
    });
    const clientId = ((await reg.json()) as { client_id: string }).client_id;
    const verifier = randomBytes(32).toString("base64url");
    const u = new URL(`${origin}/authorize`);
    u.search = new URLSearchParams({
      response_type: "code",
      client_id: clientId,
      redirect_uri: REDIRECT,
      code_challenge: createHash("sha256").update(verifier).digest("base64url"),
      code_challenge_method: "S256",
      scope: "project:read",
      resource: `${origin}/mcp`,
    }).toString();
    const answered = await answerConsent(origin, await openConsent(u), { action: "approve", key: runKey });
    await tokenRequest(origin, {
      grant_type: "authorization_code",
      client_id: clientId,
      code: answered.location?.searchParams.get("code") ?? "",
      code_verifier: verifier,
      redirect_uri: REDIRECT,
    });

    for (const shot of [
      { file: "console-desktop.png", viewport: { width: 1280, height: 900 }, colorScheme: "light" as const },
      { file: "console-phone.png", viewport: { width: 390, height: 844 }, colorScheme: "dark" as const },
    ]) {
      const context = await browser.newContext({ viewport: shot.viewport, colorScheme: shot.colorScheme });
      const page = await context.newPage();
      await page.goto(`${origin}/console/login`);
      await page.fill("#key", key);
      await Promise.all([page.waitForNavigation(), page.click('button[type="submit"]')]);
      await page.goto(`${origin}/console?run=${slow.run_id}`);
      await page.waitForSelector('[data-runner="build-01"].online');
      await page.waitForSelector("#run-events-list li");
      await page.waitForTimeout(SETTLE_MS);
      await page.screenshot({ path: join(DOCS, shot.file), fullPage: true });
      expect((await page.locator("body").textContent()) ?? "").not.toContain(key);
      await context.close();
    }
    await stack.cancel("alice", { run_id: slow.run_id });
  } finally {
    await browser.close();
    await stack.stop();
  }
});
