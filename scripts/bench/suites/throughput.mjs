/**
 * Event throughput: the fake agent's `burst` scenario, from the agent starting
 * to emit (ledger hr_ms) to the last update being visible to the reader —
 * the bare SDK client for the baseline, an MCP observer for our stack.
 */
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { openBareSession } from "../lib/acp-client.mjs";
import { LedgerReader } from "../lib/ledger.mjs";
import { fakeAgentArgv } from "../lib/paths.mjs";
import { ProcSampler } from "../lib/proc.mjs";
import { runnerLogTime } from "../lib/runner-timings.mjs";
import { hrNow } from "../lib/stats.mjs";
import { makeTempDir } from "../lib/tmp.mjs";

export function burstPrompt({ count, chunk, kind }) {
  return `scenario: burst count=${count} chunk=${chunk} kind=${kind}\nbench-nonce ${randomUUID()}`;
}

/** Payload bytes the agent emits for a burst (text of message chunks, titles of tool calls). */
export function burstPayloadBytes({ count, chunk, kind }) {
  return kind === "message" ? count * chunk : Math.ceil(count / 2) * chunk;
}

function rates(spec, elapsedMs, extra = {}) {
  const secs = elapsedMs / 1000;
  return {
    ...spec,
    elapsed_ms: elapsedMs,
    updates_per_s: spec.count / secs,
    payload_bytes: burstPayloadBytes(spec),
    bytes_per_s: burstPayloadBytes(spec) / secs,
    ...extra,
  };
}

/** The same burst read by a bare ACP SDK client. */
export async function baseline(_ctx, spec) {
  const dir = makeTempDir("burst-baseline");
  const ledgerFile = join(dir, "ledger.jsonl");
  const ledger = new LedgerReader(ledgerFile);
  let updates = 0;
  let bytes = 0;
  const session = await openBareSession({
    argv: fakeAgentArgv(ledgerFile),
    cwd: dir,
    onUpdate: (params) => {
      updates++;
      const u = params.update;
      if (u.sessionUpdate === "agent_message_chunk" && u.content?.type === "text") bytes += u.content.text.length;
      else if (u.sessionUpdate === "tool_call") bytes += u.title.length;
    },
  });
  try {
    const prompt = burstPrompt(spec);
    const sampler = new ProcSampler({ agent: session.pid }, 100).start();
    const response = await session.prompt(prompt);
    const tEnd = hrNow();
    const resources = sampler.stop();
    const entry = await ledger.waitFor(prompt, 5000);
    return rates(spec, tEnd - entry.hr_ms, {
      updates_seen: updates,
      payload_bytes_seen: bytes,
      stop_reason: response.stopReason,
      resources,
    });
  } finally {
    await session.close();
  }
}

/**
 * Our stack: start the burst through MCP, one observer reads with tokens
 * until terminal. Samples the Runner's and Server's RSS/CPU meanwhile.
 */
export async function stack(ctx, { stack, spec }) {
  const mcp = await stack.mcpClient();
  const sampler = new ProcSampler(stack.pids(), 50).start();
  try {
    const prompt = burstPrompt(spec);
    const started = await mcp.start({ provider_id: stack.providerId, prompt, timeout_secs: 600 });
    if (!started.ok) throw new Error(`start_coding_agent failed: ${JSON.stringify(started.error)}`);
    let events = 0;
    let textBytes = 0;
    let historyLost = false;
    let calls = 0;
    const final = await mcp.observeToEnd(started.value.run_id, started.value.observation_token, ctx.budgetMs(120_000), {
      onResult: (r) => {
        calls++;
        if (r.history_lost) historyLost = true;
        for (const e of r.events) {
          if (e.kind === "terminal") continue;
          events++;
          if (e.kind === "agent_message") textBytes += e.text.length;
          else if (e.kind === "tool_activity" && e.status === "in_progress") textBytes += e.title.length;
        }
      },
    });
    const tEnd = hrNow();
    const resources = sampler.stop();
    const entry = await stack.ledger.waitFor(prompt, 5000);
    // When the Runner had the agent's last update and its prompt response (its "run terminal" line):
    // the rest of the elapsed time is Server + observer catching up.
    const runnerDone = runnerLogTime(join(stack.dir, "runner.log"), started.value.run_id, "run terminal");
    return rates(spec, tEnd - entry.hr_ms, {
      runner_terminal_after_ms: runnerDone === null ? null : runnerDone - entry.hr_ms,
      state: final.state,
      events_seen: events,
      payload_bytes_seen: textBytes,
      observe_calls: calls,
      history_lost: historyLost,
      resources,
    });
  } finally {
    sampler.stop();
    await mcp.close();
  }
}
