/**
 * The operator's management of a subscription through the whole stack (design §18, issue 43): `webhooks
 * rotate-secret` (the new secret shown once; the previous one still verifies, as a second signature, until the
 * overlap ends) and a subscription disabled after failing in a row (`[server.webhooks] disable_after_failures` /
 * `disable_after_secs`), shown as such by `list`, audited, and turned back on by `webhooks enable`. A real Server,
 * Runner and fake agent, and a real receiver verifying with `standardwebhooks`.
 */
import { randomBytes } from "node:crypto";
import { Webhook } from "standardwebhooks";
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { ProcStack } from "../support/proc-stack.js";
import { WebhookReceiver } from "../support/webhook-receiver.js";
import { subscribe, verified, WEBHOOK_TOML, webhooksCli } from "../support/webhooks.js";

let stack: ProcStack | null = null;
const receivers: WebhookReceiver[] = [];

afterEach(async () => {
  for (const r of receivers.splice(0)) await r.close();
  await stack?.stop();
  stack = null;
});

async function started(extraToml = ""): Promise<ProcStack> {
  stack = await new ProcStack({
    runners: [{ id: "r1", projects: ["demo"] }],
    extraServerToml: `${WEBHOOK_TOML}${extraToml}`,
  }).init();
  await stack.startRunner("r1");
  return stack;
}

async function receiver(answer?: () => number): Promise<WebhookReceiver> {
  const r = await new WebhookReceiver(answer).start();
  receivers.push(r);
  return r;
}

function verifies(secret: string, req: { body: string; headers: Record<string, string> }): boolean {
  try {
    new Webhook(secret).verify(req.body, req.headers);
    return true;
  } catch {
    return false;
  }
}

async function cliOk(args: string[]): Promise<string> {
  const out = await webhooksCli(args);
  expect(out.code, out.stderr).toBe(0);
  return out.stdout;
}

describe("managing a subscription, whole stack", () => {
  it("rotate-secret: the new secret verifies at once, the previous one until the overlap ends, then only the new one", async () => {
    const s = await started();
    const hook = await receiver();
    const sub = await subscribe(s.serverConfigFile, "alice", hook.url, "run.terminal");
    const rotated = JSON.parse(
      await cliOk(["rotate-secret", "--config", s.serverConfigFile, "--id", sub.subscription_id, "--json"]),
    ) as { secret: string; previous_secret_until_ms: number };
    expect(rotated.secret).toMatch(/^whsec_/);
    expect(rotated.secret).not.toBe(sub.secret);
    const overlapping = await s.runToEnd("rotate-1");
    const [first] = await poll(() => (hook.received.length >= 1 ? hook.received : undefined), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the event sent during the overlap",
    });
    if (!first) throw new Error("no request");
    expect(first.headers["webhook-signature"]?.split(" ")).toHaveLength(2);
    expect(verifies(rotated.secret, first)).toBe(true);
    expect(verifies(sub.secret, first)).toBe(true);
    expect(verified(hook, rotated.secret)[0]?.data.run_id).toBe(overlapping.run_id);
    // A rotation with no overlap: only the newest secret verifies what follows.
    const now = JSON.parse(
      await cliOk([
        "rotate-secret",
        "--config",
        s.serverConfigFile,
        "--id",
        sub.subscription_id,
        "--overlap-secs",
        "0",
        "--json",
      ]),
    ) as { secret: string };
    const after = await s.runToEnd("rotate-2");
    await poll(() => hook.received.length >= 2, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the event sent after the second rotation",
    });
    const second = hook.received[1];
    if (!second) throw new Error("no request");
    expect(second.headers["webhook-signature"]?.split(" ")).toHaveLength(1);
    expect(verifies(now.secret, second)).toBe(true);
    expect(verifies(rotated.secret, second)).toBe(false);
    expect(verifies(sub.secret, second)).toBe(false);
    expect(verifies(`whsec_${randomBytes(32).toString("base64")}`, second)).toBe(false);
    const body = new Webhook(now.secret).verify(second.body, second.headers) as { data: { run_id: string } };
    expect(body.data.run_id).toBe(after.run_id);
    // Bad input names the flag and what is allowed; nothing is rotated.
    const bad = await webhooksCli([
      "rotate-secret",
      "--config",
      s.serverConfigFile,
      "--id",
      sub.subscription_id,
      "--overlap-secs",
      "9999999",
    ]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("--overlap-secs: a whole number of seconds from 0 to 604800");
    const unknown = await webhooksCli(["rotate-secret", "--config", s.serverConfigFile, "--id", "whsub_nope"]);
    expect(unknown.code).toBe(1);
    const audit = JSON.parse(await cliOk(["audit", "--config", s.serverConfigFile, "--json"])) as {
      audit: { event: string; actor: string; subscription_id: string }[];
    };
    expect(audit.audit.map((r) => r.event)).toEqual(["secret_rotated", "secret_rotated", "added"]);
    const listed = await cliOk(["list", "--config", s.serverConfigFile, "--json"]);
    for (const secret of [sub.secret, rotated.secret, now.secret]) expect(listed).not.toContain(secret);
  }, 120_000);

  it("disables a subscription that keeps failing, shows and audits it, and enable delivers its held event with the same id", async () => {
    const s = await started("disable_after_failures = 3\ndisable_after_secs = 0\n");
    let status = 500;
    const hook = await receiver(() => status);
    const sub = await subscribe(s.serverConfigFile, "alice", hook.url, "run.terminal");
    const first = await s.runToEnd("disable-1");
    type Listed = { subscriptions: { status: string; disabled_at: string | null; pending: number }[] };
    const disabled = await poll(
      async () => {
        const out = JSON.parse(await cliOk(["list", "--config", s.serverConfigFile, "--json"])) as Listed;
        return out.subscriptions[0]?.status === "disabled" ? out.subscriptions[0] : undefined;
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the subscription disabled" },
    );
    expect(disabled.pending).toBe(1);
    expect(typeof disabled.disabled_at).toBe("string");
    expect(hook.received).toHaveLength(3);
    const text = await cliOk(["list", "--config", s.serverConfigFile]);
    expect(text).toMatch(new RegExp(`${sub.subscription_id}\\t.*\\tdisabled\\t.*disabled_at=`));
    const [audit] = (
      JSON.parse(await cliOk(["audit", "--config", s.serverConfigFile, "--id", sub.subscription_id, "--json"])) as {
        audit: { event: string; actor: string; detail: string }[];
      }
    ).audit;
    expect(audit).toMatchObject({ event: "disabled", actor: "delivery" });
    expect(audit?.detail).toContain("3 consecutive failed attempts");
    // A disabled subscription gets no new event: the second run's end committed none for it.
    const second = await s.runToEnd("disable-2");
    expect(await s.stateRows("SELECT event_id FROM webhook_outbox WHERE run_id = ?", [second.run_id])).toEqual([]);
    // Enabled again (the receiver healed): the held event goes out, with the id of its failed attempts.
    status = 200;
    await cliOk(["enable", "--config", s.serverConfigFile, "--id", sub.subscription_id]);
    const events = await poll(() => (hook.received.length >= 4 ? verified(hook, sub.secret) : undefined), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the held event delivered after enable",
    });
    expect(events.map((e) => e.status)).toEqual([500, 500, 500, 200]);
    expect(new Set(events.map((e) => e.id)).size).toBe(1);
    expect(events[3]?.data.run_id).toBe(first.run_id);
    const listed = JSON.parse(await cliOk(["list", "--config", s.serverConfigFile, "--json"])) as Listed;
    expect(listed.subscriptions[0]).toMatchObject({ status: "active", disabled_at: null });
  }, 120_000);
});
