/**
 * Webhooks (issue 43, design §18): what one subscription costs a start, and how soon its receiver hears of a
 * run's end. Two stacks with the same config (`[server.webhooks] allow_loopback_http = true`); on one of them the
 * principal has a subscription (added with `webcodex-server webhooks add`, as an operator does) to every run
 * event, delivered to a real `node:http` receiver on 127.0.0.1 answering 200. The two stacks alternate run by
 * run (the order swapped every round) so both see the same machine load.
 *
 * - start-to-dispatch, with ÷ without: the `start` suite's measurement (`oursOnce`) on each stack.
 * - delivery: the Runner's `run terminal` log time of a run → its `run.terminal` event fully arrived at the
 *   receiver; and the run's dispatch (the ledger's prompt entry) → its `run.started` at the receiver. Each run of the subscribed stack waits for
 *   its `run.terminal` delivery (≤ DELIVERY_WAIT_MS) before the next run starts, so no delivery overlaps the
 *   other stack's start.
 */
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { SERVER_BIN } from "../lib/paths.mjs";
import { runnerLogTime } from "../lib/runner-timings.mjs";
import { ratio, summarize } from "../lib/stats.mjs";
import { startReceiver } from "../lib/webhook-receiver.mjs";
import { launchStack } from "../stack.mjs";
import { oursOnce } from "./start-dispatch.mjs";

const exec = promisify(execFile);

/** Both stacks' Server config: loopback http receivers allowed (the operator's setting for local tools). */
const WEBHOOKS_TOML = "[server.webhooks]\nallow_loopback_http = true\n";
/** The events the subscription takes: every run event. */
const RUN_EVENTS = "run.started,run.waiting_permission,run.terminal,run.lost";
/** How long the bench waits for a run's `run.terminal` at the receiver before counting it missing. */
const DELIVERY_WAIT_MS = 30_000;
/** How long `webcodex-server webhooks add` may take. */
const CLI_TIMEOUT_MS = 60_000;

/** `webcodex-server webhooks add … --json` against the stack's config and state: the subscription's id. */
async function subscribe(stack, principal, url) {
  const { stdout } = await exec(
    process.execPath,
    [
      SERVER_BIN,
      "webhooks",
      "add",
      "--config",
      stack.serverConfig,
      "--principal",
      principal,
      "--url",
      url,
      "--events",
      RUN_EVENTS,
      "--json",
    ],
    { cwd: stack.dir, env: stack.env, timeout: CLI_TIMEOUT_MS },
  );
  return JSON.parse(stdout.trim().split("\n").at(-1)).subscription_id;
}

export async function run(ctx, { runs, nodeArgs = {} }) {
  const receiver = await startReceiver();
  const stacks = [];
  try {
    const without = await launchStack({ label: "webhooks-without", nodeArgs, serverToml: WEBHOOKS_TOML });
    stacks.push(without);
    const withSub = await launchStack({ label: "webhooks-with", nodeArgs, serverToml: WEBHOOKS_TOML });
    stacks.push(withSub);
    const subscriptionId = await subscribe(withSub, "bench-0", receiver.url);
    return await measure(ctx, { runs, without, withSub, receiver, subscriptionId });
  } finally {
    for (const s of stacks) await s.stop();
    await receiver.close();
  }
}

async function measure(ctx, { runs, without, withSub, receiver, subscriptionId }) {
  const samples = { without: [], with: [] };
  const terminalDelivery = [];
  const startedDelivery = [];
  const failures = [];
  let duplicates = 0;
  let missing = 0;
  const runIds = [];
  const clients = { without: await without.mcpClient(), with: await withSub.mcpClient() };
  const stacks = { without, with: withSub };
  const deadline = Date.now() + ctx.budgetMs(300_000);
  try {
    for (let i = 0; i < runs && Date.now() < deadline; i++) {
      for (const side of i % 2 === 0 ? ["without", "with"] : ["with", "without"]) {
        let r;
        try {
          r = await oursOnce(stacks[side], clients[side]);
        } catch (error) {
          r = { error: String(error?.message ?? error).split("\n")[0] };
        }
        if (r.error) {
          failures.push({ side, error: r.error });
          continue;
        }
        samples[side].push(r.ms);
        if (r.state !== "completed") failures.push({ side, run_id: r.run_id, state: r.state });
        if (r.dispatches !== 1) duplicates++;
        if (side !== "with") continue;
        runIds.push(r.run_id);
        const arrived = await receiver.arrival(r.run_id, "run.terminal", DELIVERY_WAIT_MS);
        const terminalAt = runnerLogTime(join(withSub.dir, "runner.log"), r.run_id, "run terminal");
        if (arrived === null) missing++;
        else if (terminalAt !== null) terminalDelivery.push(arrived - terminalAt);
        const started = await receiver.arrival(r.run_id, "run.started", 0);
        if (started !== null) startedDelivery.push(started - (r.t0 + r.ms));
      }
    }
  } finally {
    await clients.without.close();
    await clients.with.close();
  }
  const withL = summarize(samples.with);
  const withoutL = summarize(samples.without);
  // At least once: the same event twice is allowed (same webhook-id); counted so a change in it shows.
  const redelivered = runIds.reduce(
    (n, id) =>
      n + Math.max(0, receiver.count(id, "run.started") - 1) + Math.max(0, receiver.count(id, "run.terminal") - 1),
    0,
  );
  ctx.log(`webhooks: ${samples.with.length} runs each, ${receiver.total()} events received, ${missing} missing`);
  return {
    subscription_id: subscriptionId,
    events: RUN_EVENTS.split(","),
    without: { runs: samples.without.length, latency_ms: withoutL, samples_ms: samples.without },
    with: { runs: samples.with.length, latency_ms: withL, samples_ms: samples.with },
    p50_ratio: ratio(withL.p50, withoutL.p50),
    p95_ratio: ratio(withL.p95, withoutL.p95),
    p99_ratio: ratio(withL.p99, withoutL.p99),
    delivery_ms: { terminal: summarize(terminalDelivery), started_after_dispatch: summarize(startedDelivery) },
    events_received: receiver.total(),
    missing_terminal_deliveries: missing,
    extra_deliveries: redelivered,
    failures: failures.slice(0, 5),
    failure_count: failures.length,
    duplicate_dispatches: duplicates,
  };
}
