/**
 * Continuation tests (design §17): follow a run to its end over observe_coding_agent and keep what the agent
 * said, so a test can tell a resumed session (`scenario: recall` names the earlier prompt's nonce) from a fresh one.
 */
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { ok, type Structured, TERMINAL } from "./tool-calls.js";

/** Observe calls one turn may take before the test gives up (each waits up to 5 s). */
const MAX_OBSERVE_CALLS = 200;

/** Observe `runId` to its end; the last observation and the concatenated text of its agent messages. */
export async function followTurn(client: Client, runId: string): Promise<{ last: Structured; text: string }> {
  let token: string | undefined;
  let text = "";
  for (let i = 0; i < MAX_OBSERVE_CALLS; i++) {
    const o = await ok(client, "observe_coding_agent", {
      run_id: runId,
      ...(token === undefined ? {} : { after_observation_token: token }),
      wait_secs: 5,
    });
    token = o.observation_token as string;
    for (const e of o.events as { kind: string; text?: string }[]) if (e.kind === "agent_message") text += e.text;
    if (TERMINAL.has(o.state as string) && !o.has_more) return { last: o, text };
  }
  throw new Error(`run ${runId} did not end`);
}

/** Start a start_coding_agent run on project demo, provider fake (continuing `continueRunId`) and follow it. */
export async function runTurn(
  client: Client,
  key: string,
  prompt: string,
  continueRunId?: string,
): Promise<{ runId: string; last: Structured; text: string }> {
  const started = await ok(client, "start_coding_agent", {
    project_id: "demo",
    provider_id: "fake",
    idempotency_key: key,
    prompt,
    ...(continueRunId === undefined ? {} : { continue_run_id: continueRunId }),
  });
  const runId = started.run_id as string;
  return { runId, ...(await followTurn(client, runId)) };
}
