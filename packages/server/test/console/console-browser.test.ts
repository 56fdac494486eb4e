/**
 * The operator console (design §15) in a real headless browser (support/browser.ts: the Chromium that
 * @sparticuz/chromium ships, driven by playwright-core) against a real Server child process, a real Runner
 * and the fake ACP agent: sign in with an operator:read key, watch a Runner go offline and come back, a run
 * appear and finish, revoke an OAuth grant and see its token stop working. A key without operator:read, a
 * request without a session and a POST without the CSRF token are refused; no response of the console
 * carries a prompt, a token or an absolute path of the stack (long random canaries). Project `ws` is a
 * `worktree` project (design §16): the console lists a run's changed files, never the diff. The agent resumes
 * sessions (design §17), so the console shows a chain of runs; a webhook dead letter can be redelivered (§18).
 */
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { type Browser, type BrowserContext, chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, poll, REPO_ROOT } from "../../../../scripts/test-support/index.js";
import { CONSOLE_WEBHOOK_COUNTS_MS } from "../../src/console/snapshot.js";
import { browserLaunchOptions } from "../support/browser.js";
import { answerConsent, issueKey, mcpPost, openConsent, serverCli, tokenRequest } from "../support/oauth.js";
import { okValue, ProcStack } from "../support/proc-stack.js";
import { WebhookReceiver } from "../support/webhook-receiver.js";
import { subscribe, webhooksCli } from "../support/webhooks.js";

/** "Within seconds": how long the page may take to show a change of the shared state. */
const LIVE_DEADLINE_MS = 5_000;
const REDIRECT = "https://app.example/callback";
const PROMPT_CANARY = `promptcanary${randomBytes(24).toString("hex")}`;
const LIST = { method: "tools/list" };
/** `[server.webhooks] retry_base_ms` here: its maximum, so a failed event is not tried again during the test. */
const RETRY_BASE_MS = 600_000;

let stack: ProcStack;
let origin: string;
let browser: Browser;
let operatorKey: string;
let runKey: string;
let sessions: string;
/** Every secret of this stack that must never reach a console response. */
const canaries = new Set<string>();

beforeAll(async () => {
  sessions = mkdtempSync(join(tmpdir(), "wc-console-sessions-"));
  stack = await new ProcStack({
    runners: [{ id: "r1", projects: ["demo", "ws"], worktreeProjects: ["ws"] }],
    server: "child",
    serverSection: (port) => `public_url = "http://127.0.0.1:${port}"`,
    // Webhook retries far apart: after one failed attempt an event waits minutes (the dead-letter test below).
    extraServerToml: `[oauth]\nenabled = true\n[server.webhooks]\nallow_loopback_http = true\nretry_base_ms = ${RETRY_BASE_MS}\n`,
    extraScopes: ["operator:read"],
    agentArgs: ["--continuation", "both", "--session-dir", sessions],
    agentToml: 'continuation = "both"',
  }).init();
  origin = `http://127.0.0.1:${stack.port}`;
  operatorKey = await issueKey(stack.serverConfigFile, "alice", ["operator:read"], []);
  runKey = await issueKey(
    stack.serverConfigFile,
    "alice",
    ["coding_agent:run", "project:write", "project:read"],
    ["demo"],
  );
  for (const k of [operatorKey, runKey, ...stack.principalTokens.values(), ...stack.tokens.values()]) canaries.add(k);
  await stack.startRunner("r1");
  browser = await chromium.launch(await browserLaunchOptions());
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await stack?.stop();
  if (sessions) rmSync(sessions, { recursive: true, force: true });
});

async function signIn(key: string): Promise<{ context: BrowserContext; page: Page; status: number | undefined }> {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  await page.goto(`${origin}/console`);
  expect(new URL(page.url()).pathname).toBe("/console/login");
  await page.fill("#key", key);
  const [response] = await Promise.all([page.waitForNavigation(), page.click('button[type="submit"]')]);
  return { context, page, status: response?.status() };
}

async function grantWithToken(): Promise<{ grantId: string; access: string }> {
  const reg = await fetch(`${origin}/register`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      client_name: "Console test app",
      redirect_uris: [REDIRECT],
      token_endpoint_auth_method: "none",
    }),
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
    state: "s",
    resource: `${origin}/mcp`,
  }).toString();
  const answered = await answerConsent(origin, await openConsent(u), { action: "approve", key: runKey });
  const code = answered.location?.searchParams.get("code") ?? "";
  canaries.add(code);
  const t = await tokenRequest(origin, {
    grant_type: "authorization_code",
    client_id: clientId,
    code,
    code_verifier: verifier,
    redirect_uri: REDIRECT,
  });
  const access = String(t.body.access_token);
  canaries.add(access);
  canaries.add(String(t.body.refresh_token));
  const { stdout } = await serverCli([
    "oauth",
    "grants",
    "list",
    "--json",
    "--client",
    clientId,
    "--config",
    stack.serverConfigFile,
  ]);
  const grantId = (JSON.parse(stdout) as { grant_id: string }[])[0]?.grant_id ?? "";
  return { grantId, access };
}

/** Reads the console's event stream with the page's session cookie for `ms`; returns what arrived. */
async function readStream(context: BrowserContext, query: string, ms: number): Promise<string> {
  const cookies = await context.cookies(`${origin}/console`);
  const header = cookies.map((c) => `${c.name}=${c.value}`).join("; ");
  const ac = new AbortController();
  const res = await fetch(`${origin}/console/events?${query}`, { headers: { cookie: header }, signal: ac.signal });
  expect(res.status).toBe(200);
  let text = "";
  const timer = setTimeout(() => ac.abort(), ms);
  try {
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) text += Buffer.from(chunk).toString();
  } catch {
    // aborted
  } finally {
    clearTimeout(timer);
  }
  return text;
}

function assertNoCanary(where: string, body: string): void {
  for (const c of canaries) expect(body.includes(c), `${where} carries a secret`).toBe(false);
  expect(body.includes(PROMPT_CANARY), `${where} carries the prompt`).toBe(false);
  expect(body.includes(stack.dir), `${where} carries the stack's absolute path`).toBe(false);
}

/**
 * One write to the Server's state, straight to its database (the PostgreSQL pass's, else the SQLite file):
 * fast-forwards what the delivery worker does over a day (MAX_ATTEMPTS failed attempts → a dead letter).
 */
async function stateWrite(sql: string, params: (string | number)[]): Promise<number> {
  if (stack.stateUrl !== undefined) {
    const { default: pg } = await import("pg");
    const client = new pg.Client({ connectionString: stack.stateUrl });
    await client.connect();
    try {
      let n = 0;
      return (
        (
          await client.query(
            sql.replace(/\?/g, () => `$${++n}`),
            params,
          )
        ).rowCount ?? 0
      );
    } finally {
      await client.end();
    }
  }
  const db = new Database(join(stack.serverStateDir, "server.sqlite3"), { fileMustExist: true, timeout: 10_000 });
  try {
    return db.prepare(sql).run(...params).changes;
  } finally {
    db.close();
  }
}

describe("operator console in a real browser", () => {
  it("refuses a key without operator:read, even one holding every run scope, and requests without a session", async () => {
    const { context, page, status } = await signIn(runKey);
    expect(status).toBe(403);
    await expect(page.locator('[role="alert"]').textContent()).resolves.toContain("lacks the operator:read scope");
    expect(new URL(page.url()).pathname).toBe("/console/login");
    await context.close();
    const bare = await fetch(`${origin}/console/api/snapshot`);
    expect(bare.status).toBe(401);
    const page2 = await fetch(`${origin}/console`, { redirect: "manual" });
    expect(page2.status).toBe(303);
    expect(page2.headers.get("location")).toBe("/console/login");
  });

  it("signs in, shows the Runner online, offline within seconds of its stop, and back after a restart", async () => {
    const { context, page, status } = await signIn(operatorKey);
    expect(status).toBe(200);
    expect(new URL(page.url()).pathname).toBe("/console");
    const cookie = (await context.cookies(`${origin}/console`)).find((c) => c.name === "wc_console");
    expect(cookie?.httpOnly).toBe(true);
    expect(cookie?.sameSite).toBe("Strict");
    await page.waitForSelector('[data-runner="r1"].online', { timeout: LIVE_DEADLINE_MS });
    await expect(page.locator('[data-runner="r1"]').textContent()).resolves.toContain("demo");
    // The Runner's software version from its hello, next to the protocol it speaks.
    const runnerVersion = JSON.parse(readFileSync(join(REPO_ROOT, "packages/runner/package.json"), "utf8")).version;
    await expect(page.locator('[data-runner="r1"]').textContent()).resolves.toContain(`Version${runnerVersion}`);

    await stack.killRunner("r1");
    await page.waitForSelector('[data-runner="r1"].offline', { timeout: LIVE_DEADLINE_MS });
    await stack.startRunner("r1");
    await page.waitForSelector('[data-runner="r1"].online', { timeout: LIVE_DEADLINE_MS });
    await context.close();
  });

  it("shows a run appear and finish, and its events with agent text reduced to its length", async () => {
    const { context, page } = await signIn(operatorKey);
    const started = okValue(
      await stack.start("alice", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: "console-run-1",
        prompt: `scenario: slow interval_ms=200 count=6\n${PROMPT_CANARY}`,
      }),
    );
    await page.waitForSelector(`tr[data-run="${started.run_id}"]`, { timeout: LIVE_DEADLINE_MS });
    await stack.untilTerminal(started.run_id);
    await page.waitForSelector(`tr[data-run="${started.run_id}"][data-state="completed"]`, {
      timeout: LIVE_DEADLINE_MS,
    });
    // The agent says the canary: the console shows that it spoke, never what.
    const echoed = okValue(
      await stack.start("alice", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: "console-run-2",
        prompt: `scenario: hello text="the agent repeats ${PROMPT_CANARY} here"`,
      }),
    );
    const done = await stack.untilTerminal(echoed.run_id);
    expect(JSON.stringify(done.events)).toContain(PROMPT_CANARY);
    await page.click(`tr[data-run="${echoed.run_id}"] button.link`);
    await page.waitForSelector("#run-events-list li.event-agent_message", { timeout: LIVE_DEADLINE_MS });
    // The run's outcome above its events, as `webcodex observe` prints it: state, stop reason, message.
    await expect(page.locator("#run-events-outcome").textContent()).resolves.toBe(
      "completed · stop reason end_turn — The agent completed the turn.",
    );
    const shown = (await page.locator("body").textContent()) ?? "";
    expect(shown).toContain("characters");
    assertNoCanary("the rendered page", shown);
    const stream = await readStream(context, `run=${echoed.run_id}`, 1500);
    expect(stream).toContain("event: snapshot");
    expect(stream).toContain(echoed.run_id);
    assertNoCanary("the event stream", stream);
    await context.close();
  });

  it("revokes an OAuth grant with a CSRF-checked POST, and the grant's token stops working", async () => {
    const { grantId, access } = await grantWithToken();
    expect((await mcpPost(origin, access, LIST)).status).toBe(200);
    const { context, page } = await signIn(operatorKey);
    const row = `tr[data-grant="${grantId}"]`;
    await page.waitForSelector(`${row} button.danger`, { timeout: LIVE_DEADLINE_MS });

    // Without the CSRF token, from the console's own origin and with its session cookie: refused, nothing changes.
    const refused = await page.evaluate(async (id) => {
      const r = await fetch("/console/grants/revoke", {
        method: "POST",
        headers: { "content-type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams({ grant_id: id }).toString(),
      });
      return { status: r.status, body: await r.text() };
    }, grantId);
    expect(refused.status).toBe(403);
    expect(refused.body).toContain("CSRF");
    expect((await mcpPost(origin, access, LIST)).status).toBe(200);

    page.once("dialog", (d) => void d.accept());
    await page.click(`${row} button.danger`);
    await page.waitForSelector(`${row} >> text=operator_console:alice`, { timeout: LIVE_DEADLINE_MS });
    expect((await mcpPost(origin, access, LIST)).status).toBe(401);
    const { stdout } = await serverCli(["oauth", "audit", "list", "--json", "--config", stack.serverConfigFile]);
    const audit = JSON.parse(stdout) as { event: string; grant_id: string | null; detail: string | null }[];
    expect(
      audit.some((r) => r.event === "grant_revoked" && r.grant_id === grantId && r.detail === "operator_console:alice"),
    ).toBe(true);
    await context.close();
  });

  it("serves a strict CSP, loads nothing from elsewhere, and no console response carries a secret or path", async () => {
    const { context, page } = await signIn(operatorKey);
    const requests: string[] = [];
    page.on("request", (r) => requests.push(r.url()));
    const res = await page.goto(`${origin}/console`);
    const csp = res?.headers()["content-security-policy"] ?? "";
    expect(csp).toContain("default-src 'self'");
    expect(csp).toContain("frame-ancestors 'none'");
    expect(csp).not.toContain("unsafe-inline");
    await page.waitForSelector('[data-runner="r1"]', { timeout: LIVE_DEADLINE_MS });
    expect(requests.every((u) => u.startsWith(origin))).toBe(true);
    const cookies = (await context.cookies(`${origin}/console`)).map((c) => `${c.name}=${c.value}`).join("; ");
    for (const path of ["/console", "/console/console.js", "/console/console.css", "/console/api/snapshot"]) {
      const body = await (await fetch(`${origin}${path}`, { headers: { cookie: cookies } })).text();
      assertNoCanary(path, body);
    }
    // A filter the Server refuses is named on the page, not retried forever.
    await page.fill('#filters input[name="project"]', "two words");
    await page.click('#filters button[type="submit"]');
    await page.waitForSelector('#live[data-state="error"]', { timeout: LIVE_DEADLINE_MS });
    await expect(page.locator("#live").textContent()).resolves.toContain("project: must be");
    // Phone width: the page still lays out without a horizontal scrollbar on the document.
    await page.setViewportSize({ width: 390, height: 844 });
    const overflow = await page.evaluate<number>("document.documentElement.scrollWidth - window.innerWidth");
    expect(overflow).toBeLessThanOrEqual(0);
    await context.close();
  });

  it("lists a worktree run's changed files with counts, never its diff or the file's content", async () => {
    const { context, page } = await signIn(operatorKey);
    // The file's content is the prompt's canary, with markup around it: the console must show neither.
    const started = okValue(
      await stack.start("alice", {
        project_id: "ws",
        provider_id: "fake",
        idempotency_key: "console-ws-1",
        prompt: `scenario: edit_file path=notes/a.html text="<script>window.__pwned=1</script>${PROMPT_CANARY}" lines=3`,
      }),
    );
    await stack.untilTerminal(started.run_id);
    await page.waitForSelector(`tr[data-run="${started.run_id}"]`, { timeout: LIVE_DEADLINE_MS });
    await page.click(`tr[data-run="${started.run_id}"] button.link`);
    await page.waitForSelector("#run-changes-files tbody tr >> text=notes/a.html", { timeout: LIVE_DEADLINE_MS });
    expect(await page.locator("#run-changes-files tbody tr").allTextContents()).toEqual(["addednotes/a.html30"]);
    await expect(page.locator("#run-changes-note").textContent()).resolves.toContain(
      `Branch webcodex/run/${started.run_id}, base `,
    );
    await expect(page.locator("#run-changes-note").textContent()).resolves.toContain(
      "1 file(s). The diff is shown to the run's owner only.",
    );
    expect(await page.evaluate(() => (globalThis as { __pwned?: unknown }).__pwned)).toBeUndefined();
    const shown = (await page.locator("body").textContent()) ?? "";
    expect(shown).not.toContain("<script>");
    assertNoCanary("the rendered page", shown);
    const stream = await readStream(context, `run=${started.run_id}`, 1500);
    expect(stream).toContain("notes/a.html");
    expect(stream).not.toContain("@@");
    assertNoCanary("the event stream", stream);
    await context.close();
  });

  it("shows a chain of runs as links: the follow-up names its parent, the parent its follow-up", async () => {
    const parent = await stack.runToEnd("console-chain-1");
    const child = okValue(
      await stack.start("alice", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: "console-chain-2",
        prompt: "scenario: recall",
        continue_run_id: parent.run_id,
      }),
    );
    await stack.untilTerminal(child.run_id);
    const { context, page } = await signIn(operatorKey);
    await page.waitForSelector(`tr[data-run="${child.run_id}"]`, { timeout: LIVE_DEADLINE_MS });
    await page.click(`tr[data-run="${child.run_id}"] button.link`);
    const parentLink = `#run-chain .chain-parent button[data-run="${parent.run_id}"]`;
    await page.waitForSelector(parentLink, { timeout: LIVE_DEADLINE_MS });
    await expect(page.locator("#run-chain").textContent()).resolves.toBe(`Continues ${parent.run_id}`);
    // Following the link selects the parent, which names its follow-up.
    await page.click(parentLink);
    await page.waitForSelector(`#run-chain .chain-child button[data-run="${child.run_id}"]`, {
      timeout: LIVE_DEADLINE_MS,
    });
    await expect(page.locator("#run-events-title").textContent()).resolves.toBe(`Events of ${parent.run_id}`);
    await expect(page.locator("#run-chain").textContent()).resolves.toBe(`Continued by ${child.run_id}`);
    await context.close();
  });

  it("lists a webhook dead letter by its ids, state and counts, and redelivers it with a CSRF-checked, audited POST", async () => {
    const receiver = await new WebhookReceiver(() => 500).start(`/hook-${randomBytes(16).toString("hex")}`);
    const path = new URL(receiver.url).pathname;
    canaries.add(path);
    try {
      const sub = await subscribe(stack.serverConfigFile, "alice", receiver.url, "run.terminal");
      canaries.add(sub.secret);
      const run = await stack.runToEnd("console-webhook-1");
      // The one attempt fails (500); the next would be minutes away. Fast-forward the day of retries: dead.
      await poll(() => receiver.received.length >= 1, {
        timeoutMs: 30_000,
        intervalMs: DAEMON_POLL_MS,
        what: "the first attempt",
      });
      const eventId = receiver.received[0]?.headers["webhook-id"] ?? "";
      await poll(
        async () =>
          (await stateWrite(
            "UPDATE webhook_outbox SET status = 'dead', attempts = 12 WHERE event_id = ? AND status = 'pending'",
            [eventId],
          )) === 1,
        { timeoutMs: 30_000, intervalMs: DAEMON_POLL_MS, what: "the event settled after its failed attempt" },
      );
      const { context, page } = await signIn(operatorKey);
      const row = `#dead-letters tr[data-event="${eventId}"]`;
      await page.waitForSelector(`${row} button.danger`, { timeout: LIVE_DEADLINE_MS });
      const cells = await page.locator(`${row} td`).allTextContents();
      expect(cells.slice(0, 7)).toEqual([
        eventId,
        sub.subscription_id,
        "run.terminal",
        run.run_id,
        "completed",
        "12",
        "HTTP 500",
      ]);
      // The subscription with its counts (re-counted every CONSOLE_WEBHOOK_COUNTS_MS): one dead, none delivered.
      const subRow = page.locator(`#webhook-subs tr[data-subscription="${sub.subscription_id}"] td`);
      await expect
        .poll(() => subRow.allTextContents(), { timeout: LIVE_DEADLINE_MS + CONSOLE_WEBHOOK_COUNTS_MS })
        .toEqual([
          sub.subscription_id,
          "alice",
          new URL(receiver.url).host,
          "run.terminal",
          "active",
          "1",
          "0",
          "0",
          "1",
        ]);

      // Without the CSRF token: refused, and the letter stays dead.
      const refused = await page.evaluate(async (id) => {
        const r = await fetch("/console/webhooks/redeliver", {
          method: "POST",
          headers: { "content-type": "application/x-www-form-urlencoded" },
          body: new URLSearchParams({ event_id: id }).toString(),
        });
        return { status: r.status, body: await r.text() };
      }, eventId);
      expect(refused.status).toBe(403);
      expect(refused.body).toContain("CSRF");
      const still = await stack.stateRows<{ status: string }>("SELECT status FROM webhook_outbox WHERE event_id = ?", [
        eventId,
      ]);
      expect(still).toEqual([{ status: "dead" }]);

      receiver.answerWith(() => 200);
      await page.click(`${row} button.danger`);
      // Delivered again with the same id; the row leaves the dead letters.
      await poll(() => receiver.received.some((r, i) => i > 0 && r.status === 200), {
        timeoutMs: 30_000,
        intervalMs: DAEMON_POLL_MS,
        what: "the redelivery",
      });
      expect(receiver.received.map((r) => r.headers["webhook-id"])).toEqual([eventId, eventId]);
      await page.waitForSelector(row, { state: "detached", timeout: LIVE_DEADLINE_MS });
      const auditOf = async () =>
        (
          JSON.parse(
            (await webhooksCli(["audit", "--config", stack.serverConfigFile, "--id", sub.subscription_id, "--json"]))
              .stdout,
          ) as { audit: { event: string; actor: string; detail: string | null }[] }
        ).audit.filter((a) => a.event === "redelivered");
      expect(await auditOf()).toEqual([expect.objectContaining({ actor: "operator_console:alice", detail: eventId })]);
      // The CLI's redeliver is the same store call, audited the same way (as the operator).
      await poll(
        async () =>
          (await stateWrite("UPDATE webhook_outbox SET status = 'dead' WHERE event_id = ? AND status = 'delivered'", [
            eventId,
          ])) === 1,
        { timeoutMs: 30_000, intervalMs: DAEMON_POLL_MS, what: "the redelivered event settled" },
      );
      const cli = await webhooksCli(["redeliver", "--config", stack.serverConfigFile, "--event", eventId]);
      expect(cli.code, cli.stderr).toBe(0);
      expect((await auditOf()).map((a) => a.actor)).toEqual(["operator", "operator_console:alice"]);
      const body = (await page.locator("body").textContent()) ?? "";
      assertNoCanary("the rendered page", body);
      await context.close();
    } finally {
      await receiver.close();
    }
  });
});
