/**
 * What the tests of pushed run updates share (run-push.test.ts, peer-ws.test.ts): the cluster key, the
 * instances and run they name, an event, an update as the holder pushes it and the body a follower gets.
 */
import { isTerminalState, type RunEvent } from "@webcodex/protocol";
import { pino } from "pino";
import { IN_PROCESS_POLL_MS, IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { PeerAuth } from "../../src/cluster/peer-auth.js";
import type { RunUpdateForPush } from "../../src/cluster/run-push.js";
import { runSummary } from "./run-summary.js";

export const KEY = Buffer.alloc(32, 7);
export const HOLDER = "holder-instance-01";
export const FOLLOWER = "follower-instance-1";
export const RUN_ID = "wc_agent_run_dddddddddddddddddddddddddd";
export const AGENT_INSTANCE = "agent-instance-1";

/** The checks and answer signatures of the instance `instanceId` under KEY (cluster/peer-auth.ts). */
export function peerAuth(instanceId: string, key = KEY): PeerAuth {
  return new PeerAuth(key, instanceId, pino({ level: "silent" }));
}

export function event(seq: number): RunEvent {
  return { seq, at: new Date().toISOString(), kind: "agent_message", text: `tick ${seq}`, truncated: false };
}

/** The holder's update number `n` of RUN_ID with `events` (its summary's last_seq their last). */
export function update(n: number, events: RunEvent[], state: "running" | "completed" = "running"): RunUpdateForPush {
  const lastSeq = events.at(-1)?.seq ?? 0;
  return {
    runId: RUN_ID,
    runnerId: "r1",
    update: n,
    agentInstanceId: AGENT_INSTANCE,
    run: runSummary({
      run_id: RUN_ID,
      agent_instance_id: AGENT_INSTANCE,
      provider_instance_id: "provider-instance-1",
      last_seq: lastSeq,
      state,
      execution_state: isTerminalState(state) ? "completed" : "started",
    }),
    events,
  };
}

/** The body of a push of `u` from HOLDER to FOLLOWER, as the wire carries it. */
export function pushBody(u: RunUpdateForPush): Buffer {
  return Buffer.from(
    JSON.stringify({
      run_id: u.runId,
      runner_id: u.runnerId,
      holder: HOLDER,
      update: u.update,
      to: FOLLOWER,
      agent_instance_id: u.agentInstanceId,
      run: u.run,
      events: u.events,
    }),
  );
}

/** `poll` (scripts/test-support) of an in-process condition, with that module's in-process bound and pace. */
export async function until(check: () => boolean, what: string, timeoutMs = IN_PROCESS_WAIT_MS): Promise<void> {
  await poll(check, { timeoutMs, intervalMs: IN_PROCESS_POLL_MS, what });
}
