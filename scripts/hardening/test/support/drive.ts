/**
 * Driving a real Runner through the fake Server: run ids and fingerprints from
 * labels, the current fence from the connection's hello, start and wait for a
 * terminal state by run.sync.
 */
import { createHash } from "node:crypto";
import { base32, isTerminalState } from "@webcodex/protocol";
import { poll } from "../../../test-support/index.js";
import type { FakeServer, RunnerConn } from "./fake-server.js";

export const runId = (label: string) =>
  `wc_agent_run_${base32(createHash("sha256").update(label).digest()).slice(0, 26)}`;
export const fingerprint = (label: string) => createHash("sha256").update(label).digest("hex");

export function fence(
  conn: RunnerConn,
  providerId = "fake",
): { agent_instance_id: string; provider_instance_id: string } {
  const hello = conn.hello as {
    agent_instance_id: string;
    providers: Array<{ provider_id: string; provider_instance_id: string }>;
  };
  return {
    agent_instance_id: hello.agent_instance_id,
    provider_instance_id: hello.providers.find((p) => p.provider_id === providerId)!.provider_instance_id,
  };
}

export function startFrame(
  conn: RunnerConn,
  label: string,
  prompt: string,
  opts: { providerId?: string; timeoutSecs?: number | null } = {},
): Record<string, unknown> {
  const providerId = opts.providerId ?? "fake";
  return {
    type: "run.start",
    run_id: runId(label),
    intent_fingerprint: fingerprint(label),
    project_id: "p1",
    provider_id: providerId,
    ...fence(conn, providerId),
    prompt,
    config: {},
    timeout_secs: opts.timeoutSecs ?? null,
  };
}

export interface RunView {
  state: string;
  execution_state: string;
  failure_kind: string | null;
  stop_reason: string | null;
}

/**
 * Poll interval of waitTerminal. A run.sync is an in-memory read on the Runner, and a fault batch waits for
 * four runs before the next batch may start: a coarse poll would add most of an interval to every batch.
 */
export const TERMINAL_POLL_MS = 20;

/** Polls run.sync until the run is terminal; throws after `timeoutMs`. */
export async function waitTerminal(server: FakeServer, label: string, timeoutMs: number): Promise<RunView> {
  let last: unknown;
  return poll(
    async () => {
      const conn = await server.live();
      const r = await server.request(conn, { type: "run.sync", run_id: runId(label), after_seq: 0, max_events: 0 });
      const run = r.run as RunView | undefined;
      last = run ?? r;
      return run && isTerminalState(run.state as never) ? run : undefined;
    },
    { timeoutMs, intervalMs: TERMINAL_POLL_MS, what: () => `run ${label} to be terminal (${JSON.stringify(last)})` },
  );
}
