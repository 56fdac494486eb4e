/**
 * Observe wake-up latency: the agent emits one `tick N` chunk every
 * interval_ms (`scenario: slow`); emit time is stamped by tap-agent.mjs as the
 * bytes leave the agent. Our stack: an MCP observer blocked in
 * observe_coding_agent(wait_secs) — latency is its return time minus the emit
 * time, counted only for ticks emitted while the observer was already waiting.
 * Baseline: the bare SDK client seeing the same chunk.
 */
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { openBareSession } from "../lib/acp-client.mjs";
import { fakeAgentArgv, TAP_AGENT } from "../lib/paths.mjs";
import { hrNow, summarize } from "../lib/stats.mjs";
import { makeTempDir } from "../lib/tmp.mjs";

const TICK = /tick (\d+)\n/g;
/** `latency_after_warmup_ms` leaves out the ticks numbered below this (the tap agent counts from 0). */
export const WARMUP_TICKS = 10;

export function slowPrompt({ intervalMs, count }) {
  return `scenario: slow interval_ms=${intervalMs} count=${count}\nbench-nonce ${randomUUID()}`;
}

export function readTap(file) {
  const map = new Map();
  if (!existsSync(file)) return map;
  for (const line of readFileSync(file, "utf8").split("\n")) {
    if (!line.trim()) continue;
    try {
      const { tick, hr_ms } = JSON.parse(line);
      if (!map.has(tick)) map.set(tick, hr_ms);
    } catch {
      // partial line
    }
  }
  return map;
}

export function tapArgv(tapFile, ledgerFile) {
  return [process.execPath, TAP_AGENT, "--tap", tapFile, "--", ...fakeAgentArgv(ledgerFile)];
}

export async function baseline(_ctx, { intervalMs, count }) {
  const dir = makeTempDir("wakeup-baseline");
  const tapFile = join(dir, "tap.jsonl");
  const seenAt = new Map();
  const session = await openBareSession({
    argv: tapArgv(tapFile, join(dir, "ledger.jsonl")),
    cwd: dir,
    onUpdate: (params) => {
      const at = hrNow();
      const u = params.update;
      if (u.sessionUpdate !== "agent_message_chunk" || u.content?.type !== "text") return;
      for (const m of u.content.text.matchAll(TICK)) {
        const tick = Number(m[1]);
        if (!seenAt.has(tick)) seenAt.set(tick, at);
      }
    },
  });
  try {
    await session.prompt(slowPrompt({ intervalMs, count }));
  } finally {
    await session.close();
  }
  const tap = readTap(tapFile);
  const samples = [];
  for (const [tick, at] of seenAt) {
    const emitted = tap.get(tick);
    if (emitted !== undefined) samples.push(at - emitted);
  }
  return { ticks: count, interval_ms: intervalMs, latency_ms: summarize(samples) };
}

export async function stack(ctx, { stack, intervalMs, count, waitSecs = 10 }) {
  const mcp = await stack.mcpClient();
  try {
    const started = await mcp.start({ provider_id: stack.tapProviderId, prompt: slowPrompt({ intervalMs, count }) });
    if (!started.ok) throw new Error(`start_coding_agent failed: ${JSON.stringify(started.error)}`);
    const returns = []; // { sentAt, at, ticks[] }
    let token = started.value.observation_token;
    let state = started.value.state;
    const deadline = Date.now() + ctx.budgetMs(count * intervalMs + 30_000);
    let calls = 0;
    while (Date.now() < deadline && calls < count * 20 + 100) {
      calls++;
      const sentAt = hrNow();
      const r = await mcp.observe(started.value.run_id, token, waitSecs);
      const at = hrNow();
      if (!r.ok) throw new Error(`observe failed: ${JSON.stringify(r.error)}`);
      token = r.value.observation_token;
      state = r.value.state;
      const ticks = [];
      for (const e of r.value.events) {
        if (e.kind !== "agent_message") continue;
        for (const m of e.text.matchAll(TICK)) ticks.push(Number(m[1]));
      }
      returns.push({ sentAt, at, ticks });
      if (isTerminal(state) && !r.value.has_more) break;
    }
    const tap = readTap(stack.tapFile);
    const seen = new Set();
    const waiting = [];
    const waitingWarm = [];
    const all = [];
    for (const { sentAt, at, ticks } of returns) {
      for (const tick of ticks) {
        if (seen.has(tick)) continue;
        seen.add(tick);
        const emitted = tap.get(tick);
        if (emitted === undefined) continue;
        all.push(at - emitted);
        if (sentAt <= emitted) waiting.push(at - emitted);
        if (sentAt <= emitted && tick >= WARMUP_TICKS) waitingWarm.push(at - emitted);
      }
    }
    return {
      ticks: count,
      interval_ms: intervalMs,
      state,
      observe_calls: calls,
      ticks_seen: seen.size,
      latency_ms: summarize(waiting),
      latency_all_ms: summarize(all),
      // The same without the run's first WARMUP_TICKS ticks: what is left once the paths have run once (the
      // first pushes to a fresh instance, its first parse of a push, the run's own start).
      latency_after_warmup_ms: summarize(waitingWarm),
    };
  } finally {
    await mcp.close();
  }
}

export function isTerminal(state) {
  return state === "completed" || state === "failed" || state === "cancelled" || state === "lost";
}
