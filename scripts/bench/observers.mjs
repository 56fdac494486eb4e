#!/usr/bin/env node
/**
 * M concurrent MCP observers in one process, each an MCP client over
 * Streamable HTTP long-polling observe_coding_agent(wait_secs) on one run:
 * the lean node:http client (lib/mcp-lean.mjs) by default, the SDK Client
 * (lib/mcp-client.mjs) with `"client": "sdk"`.
 * Latency per event = time the observe call returned − the emit time the
 * simulated Runner wrote into the event text (`fanout <hr_ms>`).
 *
 *   node observers.mjs SPEC.json
 * SPEC: { url, wait_secs, duration_ms, warmup_ms, client?: "lean"|"sdk", observers: [{ token, run_id, url?, group? }] }
 * An observer's own `url` overrides `url` (observers spread over Server instances); `group` names the
 * observers whose latency is also summarized apart (`by_group`).
 * Prints one JSON line with the latency summary at the end.
 */
import { readFileSync } from "node:fs";
import { connectMcp } from "./lib/mcp-client.mjs";
import { connectLeanMcp } from "./lib/mcp-lean.mjs";
import { hrNow, summarize } from "./lib/stats.mjs";

const spec = JSON.parse(readFileSync(process.argv[2], "utf8"));
const CLIENT = spec.client ?? "lean";
if (CLIENT !== "lean" && CLIENT !== "sdk") throw new Error(`spec.client: expected "lean" or "sdk", got ${CLIENT}`);
const connect = CLIENT === "sdk" ? connectMcp : connectLeanMcp;
const FANOUT = /^fanout (\d+(?:\.\d+)?)$/;
const samples = [];
/** group → latency samples of that group's observers. */
const groupSamples = new Map();
/** group → observe calls made by that group's observers, and the fanout events their answers carried. */
const groupCalls = new Map();
const groupEvents = new Map();
/** Response body bytes of the answers that carried exactly one event after the baseline (lean client only). */
const answerBytes = [];
const errors = {};
let calls = 0;
let events = 0;

async function observer(def, startHr, endAt) {
  const mcp = await connect({ url: def.url ?? spec.url, token: def.token });
  const own = def.group === undefined ? null : (groupSamples.get(def.group) ?? []);
  if (own) groupSamples.set(def.group, own);
  try {
    let token;
    let first = true;
    while (Date.now() < endAt) {
      calls++;
      if (own) groupCalls.set(def.group, (groupCalls.get(def.group) ?? 0) + 1);
      const r = await mcp.observe(def.run_id, token, spec.wait_secs);
      const at = hrNow();
      if (!r.ok) {
        const code = r.error?.code ?? "unknown";
        errors[code] = (errors[code] ?? 0) + 1;
        await new Promise((res) => setTimeout(res, 50));
        continue;
      }
      token = r.value.observation_token;
      // The first (token-less) call returns a baseline of old events: not a wake-up.
      const baseline = first;
      first = false;
      if (!baseline && r.bytes !== undefined && r.value.events.length === 1) answerBytes.push(r.bytes);
      for (const e of r.value.events) {
        if (e.kind !== "agent_message") continue;
        const m = FANOUT.exec(e.text);
        if (!m) continue;
        events++;
        if (own) groupEvents.set(def.group, (groupEvents.get(def.group) ?? 0) + 1);
        const emitted = Number(m[1]);
        if (!baseline && emitted >= startHr) {
          samples.push(at - emitted);
          own?.push(at - emitted);
        }
      }
      if (["completed", "failed", "cancelled", "lost"].includes(r.value.state) && !r.value.has_more) break;
    }
  } finally {
    await mcp.close().catch(() => {});
  }
}

const clients = [];
const connectStart = Date.now();
// Connect in small batches so the handshakes do not all land at once.
const begin = Date.now() + 0;
const endAt = begin + spec.duration_ms + spec.observers.length * 5;
// Only events emitted after every observer is connected and warmed up count.
const startHr = hrNow() + spec.warmup_ms + spec.observers.length * 5;
for (const [i, def] of spec.observers.entries()) {
  clients.push(
    new Promise((res) => setTimeout(res, i * 5)).then(() =>
      observer(def, startHr, endAt).catch((error) => {
        const code = `exception:${String(error?.message ?? error).slice(0, 60)}`;
        errors[code] = (errors[code] ?? 0) + 1;
      }),
    ),
  );
}
await Promise.all(clients);
process.stdout.write(
  `${JSON.stringify({
    observers: spec.observers.length,
    calls,
    events,
    errors,
    connect_and_run_ms: Date.now() - connectStart,
    latency_ms: summarize(samples),
    ...(answerBytes.length > 0 ? { answer_bytes: summarize(answerBytes) } : {}),
    ...(groupSamples.size > 0
      ? {
          by_group: Object.fromEntries([...groupSamples].map(([g, list]) => [g, summarize(list)])),
          calls_by_group: Object.fromEntries(groupCalls),
          events_by_group: Object.fromEntries(groupEvents),
        }
      : {}),
    client: CLIENT,
  })}\n`,
);
process.exit(0);
