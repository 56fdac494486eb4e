/**
 * A principal's own webhook subscriptions over MCP (design §18, issue 43): the three tools behind the
 * `webhooks:write` scope (granted at OAuth consent only to a client provisioned for coding_agent:run, never by
 * default, and dropped from its tokens when it is unprovisioned), through a real SDK client (2025 era) and raw 2026-07-28 requests, against a real Server
 * child, Runner and fake agent; a real receiver verifies the events with the secret the tool answered once.
 * Another principal's subscriptions are never listed, removable or fed.
 */

import { createHash, randomBytes } from "node:crypto";
import { Webhook } from "standardwebhooks";
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { type ModernAnswer, postModern } from "../support/modern-mcp.js";
import { answerConsent, issueKey, openConsent, serverCli, tokenRequest } from "../support/oauth.js";
import { ProcStack } from "../support/proc-stack.js";
import { observeToEnd, ok, toolError } from "../support/tool-calls.js";
import { WebhookReceiver } from "../support/webhook-receiver.js";
import { WEBHOOK_TOML } from "../support/webhooks.js";

let stack: ProcStack | null = null;
const receivers: WebhookReceiver[] = [];

afterEach(async () => {
  for (const r of receivers.splice(0)) await r.close();
  await stack?.stop();
  stack = null;
});

async function modernCall(s: ProcStack, principal: string, name: string, args: Record<string, unknown>) {
  const res = await postModern(
    s.port,
    s.principalTokens.get(principal) ?? "",
    "tools/call",
    { name, arguments: args },
    { name, clientName: "webhooks-tools-test" },
  );
  expect(res.status).toBe(200);
  return (await res.json()) as ModernAnswer;
}

describe("webhook tools over MCP", () => {
  it("lets a principal with webhooks:write list, add and remove only its own subscriptions, in both eras", async () => {
    const s = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      extraScopes: ["webhooks:write"],
      extraServerToml: WEBHOOK_TOML,
    }).init();
    stack = s;
    await s.startRunner("r1");
    const hook = await new WebhookReceiver().start();
    receivers.push(hook);
    const alice = await s.mcp("alice");
    const bob = await s.mcp("bob");

    const { tools } = await alice.listTools();
    for (const name of ["list_webhook_subscriptions", "add_webhook_subscription", "remove_webhook_subscription"]) {
      const tool = tools.find((t) => t.name === name);
      if (!tool) throw new Error(`tools/list lacks ${name}`);
      expect((tool.inputSchema as { additionalProperties?: unknown }).additionalProperties).toBe(false);
    }
    const added = await ok(alice, "add_webhook_subscription", {
      url: hook.url,
      event_types: ["run.terminal", "task.closed"],
    });
    expect(added).toMatchObject({ url: hook.url, status: "active", event_types: ["run.terminal", "task.closed"] });
    expect(added.secret).toMatch(/^whsec_/);
    const id = added.subscription_id as string;
    // A private address and an unknown event type are refused, each naming what is wrong.
    const refused = await toolError(alice, "add_webhook_subscription", {
      url: "https://10.0.0.7/hook",
      event_types: ["run.terminal"],
    });
    expect(refused).toMatchObject({ code: "invalid_input" });
    expect(refused.message).toMatch(/^url: /);
    const unknownType = await toolError(alice, "add_webhook_subscription", { url: hook.url, event_types: ["run.x"] });
    expect(unknownType.code).toBe("invalid_input");
    expect(unknownType.message).toContain("event_types");

    // Bob sees none of alice's, cannot remove hers, and his own run feeds only his subscription.
    expect(await ok(bob, "list_webhook_subscriptions", {})).toEqual({ subscriptions: [] });
    expect(await toolError(bob, "remove_webhook_subscription", { subscription_id: id })).toMatchObject({
      code: "not_found",
    });
    const bobs = await ok(bob, "add_webhook_subscription", { url: `${hook.url}?bob`, event_types: ["run.terminal"] });
    const bobRun = await ok(bob, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "bob-run",
      prompt: "scenario: hello",
    });
    const aliceRun = await ok(alice, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "alice-run",
      prompt: "scenario: hello",
    });
    await observeToEnd(bob, bobRun.run_id as string);
    await observeToEnd(alice, aliceRun.run_id as string);
    const events = await poll(() => (hook.received.length >= 2 ? hook.received : undefined), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "both runs' run.terminal at the receiver",
    });
    const aliceReqs = events.filter((r) => r.body.includes(aliceRun.run_id as string));
    expect(aliceReqs).toHaveLength(1);
    expect(events.filter((r) => r.body.includes(bobRun.run_id as string))).toHaveLength(1);
    const [aliceReq] = aliceReqs;
    if (!aliceReq) throw new Error("no request");
    expect(new Webhook(added.secret as string).verify(aliceReq.body, aliceReq.headers)).toMatchObject({
      type: "run.terminal",
      data: { run_id: aliceRun.run_id, principal_id: "alice" },
    });
    expect(() => new Webhook(bobs.secret as string).verify(aliceReq.body, aliceReq.headers)).toThrow();

    // The 2026-07-28 era: the same tools, the same answers, no secret in a listing.
    const listed = await modernCall(s, "alice", "list_webhook_subscriptions", {});
    const listing = (listed.result as { structuredContent: { subscriptions: { subscription_id: string }[] } })
      .structuredContent;
    expect(listing.subscriptions.map((x) => x.subscription_id)).toEqual([id]);
    expect(JSON.stringify(listed)).not.toContain("whsec_");
    const removed = await modernCall(s, "alice", "remove_webhook_subscription", { subscription_id: id });
    expect((removed.result as { structuredContent: unknown }).structuredContent).toEqual({
      subscription_id: id,
      removed: true,
    });
    expect(await ok(alice, "list_webhook_subscriptions", {})).toEqual({ subscriptions: [] });
    expect((await ok(bob, "list_webhook_subscriptions", {})).subscriptions).toHaveLength(1);

    // A token without webhooks:write is refused, naming the scope.
    const narrow = await issueKey(s.serverConfigFile, "alice", ["coding_agent:run"], ["demo"]);
    const narrowRes = await postModern(
      s.port,
      narrow,
      "tools/call",
      {
        name: "list_webhook_subscriptions",
        arguments: {},
      },
      { name: "list_webhook_subscriptions" },
    );
    const narrowAnswer = (await narrowRes.json()) as ModernAnswer;
    const text = JSON.stringify(narrowAnswer);
    expect(text).toContain("forbidden");
    expect(text).toContain("webhooks:write");

    // Every change is audited with the principal that made it.
    const audit = await s.stateRows<{ event: string; actor: string; principal_id: string }>(
      "SELECT event, actor, principal_id FROM webhook_audit ORDER BY id",
    );
    expect(audit).toEqual([
      { event: "added", actor: "principal:alice", principal_id: "alice" },
      { event: "added", actor: "principal:bob", principal_id: "bob" },
      { event: "removed", actor: "principal:alice", principal_id: "alice" },
    ]);
  }, 180_000);

  it("OAuth consent offers webhooks:write only to a provisioned client, never by default, and unprovisioning takes it away", async () => {
    const s = await new ProcStack({
      runners: [],
      server: "child",
      serverSection: (port) => `public_url = "http://127.0.0.1:${port}"`,
      extraServerToml: `${WEBHOOK_TOML}\n[oauth]\nenabled = true\n`,
      extraScopes: ["webhooks:write"],
    }).init();
    stack = s;
    const origin = `http://127.0.0.1:${s.port}`;
    const redirect = "https://app.example/callback";
    const key = await issueKey(s.serverConfigFile, "alice", ["project:read", "webhooks:write"], []);
    const reg = await fetch(`${origin}/register`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ client_name: "Hooks app", redirect_uris: [redirect], token_endpoint_auth_method: "none" }),
    });
    const clientId = ((await reg.json()) as { client_id: string }).client_id;
    const consent = async (scope: string | null) => {
      const verifier = randomBytes(32).toString("base64url");
      const u = new URL(`${origin}/authorize`);
      u.search = new URLSearchParams({
        response_type: "code",
        client_id: clientId,
        redirect_uri: redirect,
        code_challenge: createHash("sha256").update(verifier).digest("base64url"),
        code_challenge_method: "S256",
        state: "s",
        resource: `${origin}/mcp`,
        ...(scope === null ? {} : { scope }),
      }).toString();
      const page = await openConsent(u);
      const answered = await answerConsent(origin, page, { action: "approve", key });
      const t = await tokenRequest(origin, {
        grant_type: "authorization_code",
        client_id: clientId,
        code: answered.location?.searchParams.get("code") ?? "",
        code_verifier: verifier,
        redirect_uri: redirect,
      });
      return { page: page.html, scopes: String(t.body.scope ?? "").split(" "), token: String(t.body.access_token) };
    };
    const before = await consent("project:read webhooks:write");
    expect(before.scopes).toEqual(["project:read"]);
    expect(before.page).not.toContain("webhooks:write");

    await serverCli(["oauth", "clients", "allow-coding-agent-run", clientId, "--config", s.serverConfigFile]);
    const after = await consent("project:read webhooks:write");
    expect(after.scopes.sort()).toEqual(["project:read", "webhooks:write"]);
    expect(after.page).toContain("webhooks:write");
    expect((await consent(null)).scopes).not.toContain("webhooks:write");

    const listWith = async (token: string) =>
      (await (
        await postModern(
          s.port,
          token,
          "tools/call",
          { name: "list_webhook_subscriptions", arguments: {} },
          {
            name: "list_webhook_subscriptions",
          },
        )
      ).text()) as string;
    expect(JSON.parse(await listWith(after.token))).toMatchObject({
      result: { structuredContent: { subscriptions: [] } },
    });
    // Unprovisioned: the same token no longer carries webhooks:write.
    await serverCli(["oauth", "clients", "disallow-coding-agent-run", clientId, "--config", s.serverConfigFile]);
    expect(await listWith(after.token)).not.toContain('"subscriptions"');
  }, 180_000);
});
