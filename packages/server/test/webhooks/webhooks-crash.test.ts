/**
 * `kill -9` of the Server between an event's commit and its delivery (design §18, issue 43): the test-only
 * failpoint `webhook_before_attempt` SIGKILLs the Server child once an event is claimed, before its POST.
 * After a restart the event is delivered, with the id it was committed with, and the run's later event after it.
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { Webhook } from "standardwebhooks";
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll, SERVER_BIN } from "../../../../scripts/test-support/index.js";
import { SERVER_FAILPOINT_ENV } from "../../src/failpoints.js";
import { CLAIM_LEASE_MS } from "../../src/webhooks/worker.js";
import { okValue, ProcStack } from "../support/proc-stack.js";
import { WebhookReceiver } from "../support/webhook-receiver.js";

const run = promisify(execFile);
const WEBHOOK_TOML = "[server.webhooks]\nallow_loopback_http = true\nretry_base_ms = 100\n";

let stack: ProcStack | null = null;
let hook: WebhookReceiver | null = null;

afterEach(async () => {
  await hook?.close();
  hook = null;
  await stack?.stop();
  stack = null;
});

describe("Server kill -9 between an event's commit and its delivery", () => {
  it("delivers the event after a restart with the id it was committed with, then the run's next one", async () => {
    stack = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      serverEnv: { [SERVER_FAILPOINT_ENV]: "webhook_before_attempt" },
      extraServerToml: WEBHOOK_TOML,
    }).init();
    await stack.startRunner("r1");
    hook = await new WebhookReceiver().start();
    const { stdout } = await run(process.execPath, [
      SERVER_BIN,
      "webhooks",
      "add",
      "--config",
      stack.serverConfigFile,
      "--principal",
      "alice",
      "--url",
      hook.url,
      "--events",
      "run.started,run.terminal",
      "--json",
    ]);
    const sub = JSON.parse(stdout) as { secret: string };
    const started = okValue(
      await stack.start("alice", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: "crash-1",
        prompt: "scenario: slow interval_ms=100 count=30",
      }),
    );
    const child = stack.serverChild;
    await poll(() => child === null || child.exitCode !== null || child.signalCode !== null, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the Server to kill itself at the claimed event",
    });
    expect(child?.signalCode).toBe("SIGKILL");
    expect(hook.received).toEqual([]);
    const [claimed] = await stack.stateRows<{ event_id: string; status: string; event_type: string }>(
      "SELECT event_id, status, event_type FROM webhook_outbox WHERE run_id = ? ORDER BY seq",
      [started.run_id],
    );
    expect(claimed).toMatchObject({ status: "delivering", event_type: "run.started" });
    await stack.killServer();
    stack.opts.serverEnv = {};
    await stack.startServer();
    await stack.waitOnline("r1");
    await stack.untilTerminal(started.run_id);
    // On PostgreSQL the killed instance's claim is taken again when its lease runs out (CLAIM_LEASE_MS).
    const wh = new Webhook(sub.secret);
    const events = await poll(
      () => {
        const got = (hook?.received ?? []).map((r) => ({
          id: r.headers["webhook-id"],
          ...(wh.verify(r.body, r.headers) as { type: string }),
        }));
        return got.some((e) => e.type === "run.terminal") ? got : undefined;
      },
      { timeoutMs: DAEMON_WAIT_MS + CLAIM_LEASE_MS, intervalMs: DAEMON_POLL_MS, what: "both events after the restart" },
    );
    expect(events.map((e) => e.type)).toEqual(["run.started", "run.terminal"]);
    expect(events[0]?.id).toBe(claimed?.event_id);
  }, 180_000);
});
