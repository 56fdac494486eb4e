/**
 * Signed webhooks through the whole stack (design §18, issue 43): a real Server (in-process), a real Runner
 * and the fake agent, the operator's `webcodex-server webhooks` command, and a real HTTP receiver on
 * 127.0.0.1 that verifies every request with the `standardwebhooks` package, as a receiver does.
 */
import { randomBytes } from "node:crypto";
import { Webhook } from "standardwebhooks";
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { CLAIM_LEASE_MS } from "../../src/webhooks/worker.js";
import { okValue, ProcStack } from "../support/proc-stack.js";
import { HOLD, type Received, WebhookReceiver } from "../support/webhook-receiver.js";
import { webhooksCli as cli, subscribe as subscribeWith, verified, WEBHOOK_TOML } from "../support/webhooks.js";

const ALL_EVENTS = "run.started,run.waiting_permission,run.terminal,run.lost";

let stack: ProcStack | null = null;
const receivers: WebhookReceiver[] = [];

afterEach(async () => {
  for (const r of receivers.splice(0)) await r.close();
  await stack?.stop();
  stack = null;
});

function subscribe(s: ProcStack, principal: string, url: string, events: string) {
  return subscribeWith(s.serverConfigFile, principal, url, events);
}

async function receiver(answer?: (req: Received, index: number) => number): Promise<WebhookReceiver> {
  const r = await new WebhookReceiver(answer).start();
  receivers.push(r);
  return r;
}

function canary(): string {
  return randomBytes(24).toString("hex");
}

describe("signed webhooks, whole stack", () => {
  it("delivers the subscribed principal's run events, signed, and never another principal's run or a prompt", async () => {
    stack = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }], extraServerToml: WEBHOOK_TOML }).init();
    await stack.startRunner("r1");
    const hook = await receiver();
    const sub = await subscribe(stack, "alice", hook.url, ALL_EVENTS);
    expect(sub.secret).toMatch(/^whsec_/);
    // A private, a metadata and a non-loopback http address are refused at registration; nothing is written.
    for (const url of ["https://10.1.2.3/hook", "https://169.254.169.254/latest/meta-data", "http://192.0.2.10/hook"]) {
      const refused = await cli([
        "add",
        "--config",
        stack.serverConfigFile,
        "--principal",
        "alice",
        "--url",
        url,
        "--events",
        "run.terminal",
      ]);
      expect(refused.code, url).toBe(2);
      expect(refused.stderr).toMatch(/webhooks add refused: url: /);
    }
    const secrets = [canary(), canary(), canary()];
    const bobs = okValue(
      await stack.start("bob", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: "bob-1",
        prompt: `scenario: hello text="${secrets[0]}"`,
      }),
    );
    const alices = okValue(
      await stack.start("alice", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: "alice-1",
        prompt: `scenario: hello text="${secrets[1]}"\n${secrets[2]}`,
      }),
    );
    await stack.untilTerminal(bobs.run_id, "bob");
    expect((await stack.untilTerminal(alices.run_id)).state).toBe("completed");
    const events = await poll(
      () => {
        const got = verified(hook, sub.secret).filter((e) => e.data.run_id === alices.run_id);
        return got.some((e) => e.type === "run.terminal") ? got : undefined;
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "alice's run.terminal at the receiver" },
    );
    expect(events.map((e) => e.type)).toEqual(["run.started", "run.terminal"]);
    expect(events[1]?.data).toMatchObject({
      run_id: alices.run_id,
      principal_id: "alice",
      state: "completed",
      execution_state: "completed",
      stop_reason: "end_turn",
    });
    expect(typeof events[1]?.data.duration_ms).toBe("number");
    // A wrong secret does not verify: the check above is a real one.
    expect(() =>
      new Webhook(`whsec_${randomBytes(32).toString("base64")}`).verify(
        hook.received[0]?.body ?? "",
        hook.received[0]?.headers ?? {},
      ),
    ).toThrow();
    // Bob's run is terminal, so every event it caused is committed (with its state change): there is none.
    const bobRows = await stack.stateRows("SELECT event_id FROM webhook_outbox WHERE run_id = ?", [bobs.run_id]);
    expect(bobRows).toEqual([]);
    expect(hook.received.some((r) => r.body.includes(bobs.run_id))).toBe(false);
    // No prompt or agent text in any body sent or kept.
    const bodies = await stack.stateRows<{ body: string }>("SELECT body FROM webhook_outbox");
    for (const text of [...hook.received.map((r) => r.body), ...bodies.map((b) => b.body)]) {
      for (const secret of secrets) expect(text).not.toContain(secret);
    }
  }, 120_000);

  it("retries a receiver answering 500 three times with the same webhook-id, then records one delivery", async () => {
    stack = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }], extraServerToml: WEBHOOK_TOML }).init();
    await stack.startRunner("r1");
    const hook = await receiver((_req, index) => (index < 3 ? 500 : 200));
    const sub = await subscribe(stack, "alice", hook.url, "run.terminal");
    const ended = await stack.runToEnd("retry-1");
    const tries = await poll(() => (hook.received.length >= 4 ? verified(hook, sub.secret) : undefined), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "four attempts at the receiver",
    });
    expect(tries.map((t) => t.status)).toEqual([500, 500, 500, 200]);
    expect(new Set(tries.map((t) => t.id)).size).toBe(1);
    expect(tries.every((t) => t.type === "run.terminal" && t.data.run_id === ended.run_id)).toBe(true);
    const listed = await poll(
      async () => {
        const out = await cli(["list", "--config", stack?.serverConfigFile ?? "", "--json"]);
        const parsed = JSON.parse(out.stdout) as {
          subscriptions: { delivered: number; pending: number; dead: number; consecutive_failures: number }[];
        };
        const s = parsed.subscriptions[0];
        return s && s.delivered === 1 ? s : undefined;
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the delivery recorded" },
    );
    expect(listed).toMatchObject({ delivered: 1, pending: 0, dead: 0, consecutive_failures: 0 });
    const rows = await stack.stateRows<{ event_id: string; attempts: number; status: string }>(
      "SELECT event_id, attempts, status FROM webhook_outbox",
    );
    expect(rows.map((r) => ({ ...r, attempts: Number(r.attempts) }))).toEqual([
      { event_id: tries[0]?.id, attempts: 4, status: "delivered" },
    ]);
    // No more attempts come after the 200: the row is delivered, so nothing is due (checked on the row above).
    expect(hook.received).toHaveLength(4);
  }, 120_000);

  it("a Server stopped during an attempt records no failure and sends the event again after its restart, same id", async () => {
    stack = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }], extraServerToml: WEBHOOK_TOML }).init();
    await stack.startRunner("r1");
    const hook = await receiver(() => HOLD);
    const sub = await subscribe(stack, "alice", hook.url, "run.terminal");
    const ended = await stack.runToEnd("stop-1");
    await poll(() => hook.received.length === 1, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the attempt the receiver holds",
    });
    // The stop aborts the attempt in flight: it is not the receiver's failure, and its claim stays for the next start.
    await stack.killServer("SIGTERM");
    const [row] = await stack.stateRows<{ status: string; attempts: number; last_error: string | null }>(
      "SELECT status, attempts, last_error FROM webhook_outbox",
    );
    expect({ ...row, attempts: Number(row?.attempts) }).toEqual({
      status: "delivering",
      attempts: 1,
      last_error: null,
    });
    hook.answerWith(() => 200);
    await stack.startServer();
    // On PostgreSQL the claim is taken again when its lease runs out (CLAIM_LEASE_MS); on SQLite at the start.
    const tries = await poll(() => (hook.received.length >= 2 ? verified(hook, sub.secret) : undefined), {
      timeoutMs: DAEMON_WAIT_MS + CLAIM_LEASE_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the event sent again after the restart",
    });
    expect(tries[1]).toMatchObject({
      id: tries[0]?.id,
      type: "run.terminal",
      status: 200,
      data: { run_id: ended.run_id },
    });
  }, 120_000);

  it("announces a permission wait and the cancel that ends it; pings, removes and refuses unknown ids", async () => {
    stack = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }], extraServerToml: WEBHOOK_TOML }).init();
    await stack.startRunner("r1");
    const hook = await receiver();
    const sub = await subscribe(stack, "alice", hook.url, "run.waiting_permission,run.terminal");
    const started = okValue(
      await stack.start("alice", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: "perm-1",
        prompt: "scenario: permission",
      }),
    );
    await poll(() => verified(hook, sub.secret).some((e) => e.type === "run.waiting_permission"), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "run.waiting_permission at the receiver",
    });
    okValue(await stack.cancel("alice", { run_id: started.run_id }));
    const events = await poll(
      () => {
        const got = verified(hook, sub.secret);
        return got.some((e) => e.type === "run.terminal") ? got : undefined;
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "run.terminal at the receiver" },
    );
    expect(events.map((e) => e.type)).toEqual(["run.waiting_permission", "run.terminal"]);
    expect(events[1]?.data).toMatchObject({ run_id: started.run_id, state: "cancelled" });
    const ping = await cli(["test", "--config", stack.serverConfigFile, "--id", sub.subscription_id]);
    expect(ping.code, ping.stderr).toBe(0);
    const last = verified(hook, sub.secret).at(-1);
    expect(last).toMatchObject({ type: "webhook.ping", data: { subscription_id: sub.subscription_id } });
    expect((await cli(["redeliver", "--config", stack.serverConfigFile, "--event", "msg_nope"])).code).toBe(1);
    expect((await cli(["remove", "--config", stack.serverConfigFile, "--id", sub.subscription_id])).code).toBe(0);
    const listed = await cli(["list", "--config", stack.serverConfigFile]);
    expect(listed.stdout).not.toContain(sub.subscription_id);
    expect(listed.stdout).not.toContain(sub.secret);
  }, 120_000);
});
