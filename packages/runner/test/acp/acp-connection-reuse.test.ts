/**
 * One ACP connection serving several turns (a kept agent prompted again by a follow-up, runs/kept-agents.ts): each
 * prompt resolves the `promptWritten` read before it — never one already resolved by an earlier prompt — and after
 * `rebind` the agent's updates reach the new turn's hooks only. Over in-memory streams (no process).
 */
import type { SessionNotification } from "@agentclientprotocol/sdk";
import { describe, expect, it } from "vitest";
import { AcpClientConnection } from "../../src/acp/session.js";
import type { AgentChild } from "../../src/process/spawn.js";

const encoder = new TextEncoder();

/** An agent child of streams: each prompt gets one agent_message_chunk update, then its end_turn answer. */
function promptingChild(): AgentChild & { prompts: () => number } {
  let out!: ReadableStreamDefaultController<Uint8Array>;
  const stdout = new ReadableStream<Uint8Array>({
    start(controller) {
      out = controller;
    },
  });
  let buffered = "";
  let prompts = 0;
  const send = (message: unknown) => out.enqueue(encoder.encode(`${JSON.stringify(message)}\n`));
  const stdin = new WritableStream<Uint8Array>({
    write(chunk) {
      buffered += new TextDecoder().decode(chunk);
      for (let nl = buffered.indexOf("\n"); nl >= 0; nl = buffered.indexOf("\n")) {
        const request = JSON.parse(buffered.slice(0, nl)) as { id: number; method: string };
        buffered = buffered.slice(nl + 1);
        if (request.method !== "session/prompt") continue;
        prompts++;
        send({
          jsonrpc: "2.0",
          method: "session/update",
          params: {
            sessionId: "s1",
            update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: `turn ${prompts}` } },
          },
        });
        send({ jsonrpc: "2.0", id: request.id, result: { stopReason: "end_turn" } });
      }
    },
  });
  return {
    pid: 0,
    pgid: 0,
    startTime: null,
    stdin,
    stdout,
    exited: new Promise(() => {}),
    exit: null,
    stderrBytes: 0,
    stderrTail: () => "",
    terminateTree: async () => ({ escalation: "eof", survivors: 0 }),
    prompts: () => prompts,
  };
}

function hooks(seen: string[]) {
  return {
    onSessionUpdate: (n: SessionNotification) => {
      if (n.update.sessionUpdate === "agent_message_chunk" && n.update.content.type === "text") {
        seen.push(n.update.content.text);
      }
    },
    onPermissionRequest: async () => ({ outcome: { outcome: "cancelled" as const } }),
    onUnsupportedRequest: () => {},
  };
}

/** Whether `promise` has settled once the microtasks and one macrotask have run. */
async function settled(promise: Promise<void>): Promise<boolean> {
  let done = false;
  void promise.then(() => {
    done = true;
  });
  await new Promise((resolve) => setImmediate(resolve));
  return done;
}

describe("an ACP connection serving a second turn", () => {
  it("the second prompt's promptWritten waits for the second prompt; after rebind updates reach the new hooks", async () => {
    const child = promptingChild();
    const first: string[] = [];
    const second: string[] = [];
    const conn = new AcpClientConnection(child, hooks(first));

    const written1 = conn.promptWritten;
    const answer1 = await conn.prompt("s1", "one");
    expect(answer1.kind).toBe("ok");
    expect(await settled(written1)).toBe(true);
    expect(first).toEqual(["turn 1"]);

    // The next turn: its promptWritten is this prompt's, pending until it is written.
    conn.rebind(hooks(second));
    const written2 = conn.promptWritten;
    expect(await settled(written2)).toBe(false);
    const answer2 = conn.prompt("s1", "two");
    await written2;
    expect((await answer2).kind).toBe("ok");
    expect(child.prompts()).toBe(2);
    expect([first, second]).toEqual([["turn 1"], ["turn 2"]]);
    conn.close();
  });
});
