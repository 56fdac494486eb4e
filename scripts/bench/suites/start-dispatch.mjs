/**
 * Start-to-dispatch latency: from the moment a client asks for a run to the
 * fake agent receiving session/prompt (its ledger's hr_ms, same clock).
 */
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { openBareSession } from "../lib/acp-client.mjs";
import { LedgerReader } from "../lib/ledger.mjs";
import { fakeAgentArgv } from "../lib/paths.mjs";
import { runnerStageTimings } from "../lib/runner-timings.mjs";
import { hrNow, summarize } from "../lib/stats.mjs";
import { makeTempDir } from "../lib/tmp.mjs";

function helloPrompt() {
  return `scenario: hello\nbench-nonce ${randomUUID()}`;
}

/** Bare ACP SDK client: spawn → initialize → session/new → session/prompt, `runs` times. */
export async function baseline(ctx, { runs }) {
  const dir = makeTempDir("start-baseline");
  const ledgerFile = join(dir, "ledger.jsonl");
  const ledger = new LedgerReader(ledgerFile);
  const samples = [];
  const deadline = Date.now() + ctx.budgetMs(60_000);
  for (let i = 0; i < runs && Date.now() < deadline; i++) {
    const prompt = helloPrompt();
    const t0 = hrNow();
    const session = await openBareSession({ argv: fakeAgentArgv(ledgerFile), cwd: dir });
    try {
      const done = session.prompt(prompt);
      const entry = await ledger.waitFor(prompt, 10_000);
      samples.push(entry.hr_ms - t0);
      await done;
    } finally {
      await session.close();
    }
  }
  return { runs: samples.length, latency_ms: summarize(samples), samples_ms: samples };
}

/**
 * Our stack: start_coding_agent from a real MCP client → ledger hr_ms; each run
 * is observed to its terminal state before the next one starts.
 */
export async function stack(ctx, { stack, runs }) {
  const mcp = await stack.mcpClient();
  const samples = [];
  const duplicates = [];
  const failures = [];
  const deadline = Date.now() + ctx.budgetMs(90_000);
  try {
    for (let i = 0; i < runs && Date.now() < deadline; i++) {
      const prompt = helloPrompt();
      const t0 = hrNow();
      const started = await mcp.start({ provider_id: stack.providerId, prompt });
      if (!started.ok) {
        failures.push(started.error);
        continue;
      }
      const entry = await stack.ledger.waitFor(prompt, 15_000);
      samples.push(entry.hr_ms - t0);
      const final = await mcp.observeToEnd(started.value.run_id, started.value.observation_token, 15_000);
      if (final.state !== "completed") failures.push({ run_id: started.value.run_id, state: final.state });
      const n = stack.ledger.entries(prompt).length;
      if (n !== 1) duplicates.push(n);
    }
  } finally {
    await mcp.close();
  }
  return {
    runs: samples.length,
    latency_ms: summarize(samples),
    samples_ms: samples,
    failures: failures.slice(0, 5),
    failure_count: failures.length,
    duplicate_dispatches: duplicates.length,
    stages: runnerStageTimings(join(stack.dir, "runner.log")),
  };
}
