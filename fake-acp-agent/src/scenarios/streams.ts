import type { SessionUpdate } from "@agentclientprotocol/sdk";
import { z } from "zod";
import { sleep } from "../lifecycle.js";
import { CANCELLED, END_TURN, intParam, type Scenario, say, scenario, type Turn, update } from "../turn.js";

/** Updates in flight before the burst waits for stdout to take them. */
const BURST_WINDOW = 64;

const ALPHABET = "abcdefghijklmnopqrstuvwxyz";

function burstUpdate(kind: "message" | "tool", index: number, chunk: number): SessionUpdate {
  const filler = ALPHABET[index % ALPHABET.length]!.repeat(chunk);
  if (kind === "message") return { sessionUpdate: "agent_message_chunk", content: { type: "text", text: filler } };
  const toolCallId = `burst-${Math.floor(index / 2)}`;
  return index % 2 === 0
    ? { sessionUpdate: "tool_call", toolCallId, title: filler, kind: "other", status: "in_progress" }
    : { sessionUpdate: "tool_call_update", toolCallId, status: "completed" };
}

export const burst: Scenario = scenario(
  "burst count=1000 chunk=32 kind=message",
  z
    .object({
      count: intParam(1000, 0, 10_000_000),
      chunk: intParam(32, 1, 1_000_000),
      kind: z.enum(["message", "tool"]).default("message"),
    })
    .strict(),
  async (turn, { count, chunk, kind }) => {
    // Keep a bounded window in flight: the SDK writes in order, so awaiting every
    // BURST_WINDOW-th update means everything before it has reached stdout.
    let last: Promise<void> = Promise.resolve();
    for (let index = 0; index < count; index++) {
      last = update(turn, burstUpdate(kind, index, chunk));
      if (index % BURST_WINDOW === BURST_WINDOW - 1) {
        await last;
        if (turn.cancelled.aborted) return CANCELLED;
      } else last.catch(() => {});
    }
    await last;
    return turn.cancelled.aborted ? CANCELLED : END_TURN;
  },
);

async function tick(turn: Turn, index: number): Promise<void> {
  await say(turn, `tick ${index}\n`);
}

export const slow: Scenario = scenario(
  "slow interval_ms=100 count=600",
  z.object({ interval_ms: intParam(100, 0, 3_600_000), count: intParam(600, 0, 1_000_000) }).strict(),
  async (turn, { interval_ms, count }) => {
    for (let index = 0; index < count; index++) {
      if (turn.cancelled.aborted) return CANCELLED;
      await tick(turn, index);
      if (index < count - 1 && !(await sleep(interval_ms, turn.cancelled))) return CANCELLED;
    }
    return turn.cancelled.aborted ? CANCELLED : END_TURN;
  },
);
