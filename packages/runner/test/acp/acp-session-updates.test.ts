/**
 * session/update notifications reach the turn once each, in stream order, validated once by the validator
 * generated from the SDK's exported schema; one it does not accept as is takes the SDK's own path, which
 * strips or salvages it as the SDK does, and one the SDK rejects never reaches the turn. Over in-memory
 * streams (no process).
 */
import type { SessionNotification } from "@agentclientprotocol/sdk";
import { afterEach, describe, expect, it, vi } from "vitest";
import { AcpClientConnection } from "../../src/acp/session.js";
import { isAvailable, sessionUpdateValidators } from "../../src/acp/session-update-validator.js";
import type { AgentChild } from "../../src/process/spawn.js";

const encoder = new TextEncoder();

/** An agent child made of streams: `script(request)` returns the lines to write back for each request line. */
function streamChild(script: (request: { id: number; method: string }) => string[]): AgentChild {
  let out!: ReadableStreamDefaultController<Uint8Array>;
  const stdout = new ReadableStream<Uint8Array>({
    start(controller) {
      out = controller;
    },
  });
  let buffered = "";
  const stdin = new WritableStream<Uint8Array>({
    write(chunk) {
      buffered += new TextDecoder().decode(chunk);
      for (let nl = buffered.indexOf("\n"); nl >= 0; nl = buffered.indexOf("\n")) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        for (const reply of script(JSON.parse(line))) out.enqueue(encoder.encode(`${reply}\n`));
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
  };
}

const update = (sessionUpdate: unknown, text: string) =>
  JSON.stringify({
    jsonrpc: "2.0",
    method: "session/update",
    params: { sessionId: "s1", update: { sessionUpdate, content: { type: "text", text } } },
  });

afterEach(() => {
  vi.restoreAllMocks();
});

describe("session/update delivery", () => {
  it("hands each valid update to the hook once, in order, validated once; an invalid one never reaches it", async () => {
    const validators = await sessionUpdateValidators;
    if (!isAvailable(validators)) throw new Error(`generated validators unavailable: ${validators.reason}`);
    const accepts = vi.spyOn(validators, "accepts");
    vi.spyOn(console, "error").mockImplementation(() => {});
    const seen: SessionNotification[] = [];
    const child = streamChild((request) => [
      update("agent_message_chunk", "first"),
      update(42, "not an ACP update"),
      update("agent_thought_chunk", "second"),
      update("agent_message_chunk", "third"),
      JSON.stringify({
        jsonrpc: "2.0",
        id: request.id,
        result: { protocolVersion: 1, agentCapabilities: {}, authMethods: [] },
      }),
    ]);
    const connection = new AcpClientConnection(child, {
      onSessionUpdate: (n) => seen.push(n),
      onPermissionRequest: async () => ({ outcome: { outcome: "cancelled" } }),
      onUnsupportedRequest: () => {},
    });
    const answer = await connection.initialize();
    expect(answer.kind).toBe("ok");
    // The SDK's own path may still be processing the rejected line; give its microtasks a turn.
    await new Promise((resolve) => setImmediate(resolve));
    expect(seen.map((n) => [n.update.sessionUpdate, "content" in n.update ? n.update.content : null])).toEqual([
      ["agent_message_chunk", { type: "text", text: "first" }],
      ["agent_thought_chunk", { type: "text", text: "second" }],
      ["agent_message_chunk", { type: "text", text: "third" }],
    ]);
    // One validation per update line (the rejected one included), by the generated validator.
    expect(accepts).toHaveBeenCalledTimes(4);
    expect(accepts.mock.results.map((r) => r.value)).toEqual([true, false, true, true]);
    connection.close();
  });

  it("never lets an update overtake an agent request the SDK dispatches before it", async () => {
    const order: string[] = [];
    const child = streamChild((request) =>
      request.method === "initialize"
        ? [
            JSON.stringify({
              jsonrpc: "2.0",
              id: "perm-1",
              method: "session/request_permission",
              params: {
                sessionId: "s1",
                toolCall: { toolCallId: "t1", title: "Write" },
                options: [{ optionId: "no", name: "No", kind: "reject_once" }],
              },
            }),
            update("agent_message_chunk", "after the request"),
            JSON.stringify({
              jsonrpc: "2.0",
              id: request.id,
              result: { protocolVersion: 1, agentCapabilities: {}, authMethods: [] },
            }),
          ]
        : [],
    );
    const connection = new AcpClientConnection(child, {
      onSessionUpdate: () => order.push("update"),
      onPermissionRequest: async () => {
        order.push("permission");
        return { outcome: { outcome: "cancelled" } };
      },
      onUnsupportedRequest: () => {},
    });
    expect((await connection.initialize()).kind).toBe("ok");
    await new Promise((resolve) => setImmediate(resolve));
    expect(order).toEqual(["permission", "update"]);
    connection.close();
  });

  it("leaves an update with a field the schema does not know to the SDK, which strips it, in stream order", async () => {
    vi.spyOn(console, "error").mockImplementation(() => {});
    const seen: SessionNotification[] = [];
    const extra = JSON.stringify({
      jsonrpc: "2.0",
      method: "session/update",
      params: {
        sessionId: "s1",
        update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "second", unknownField: 1 } },
      },
    });
    const child = streamChild((request) => [
      update("agent_message_chunk", "first"),
      extra,
      update("agent_message_chunk", "third"),
      JSON.stringify({
        jsonrpc: "2.0",
        id: request.id,
        result: { protocolVersion: 1, agentCapabilities: {}, authMethods: [] },
      }),
    ]);
    const connection = new AcpClientConnection(child, {
      onSessionUpdate: (n) => seen.push(n),
      onPermissionRequest: async () => ({ outcome: { outcome: "cancelled" } }),
      onUnsupportedRequest: () => {},
    });
    expect((await connection.initialize()).kind).toBe("ok");
    await new Promise((resolve) => setImmediate(resolve));
    expect(seen.map((n) => ("content" in n.update ? n.update.content : null))).toStrictEqual([
      { type: "text", text: "first" },
      { type: "text", text: "second" },
      { type: "text", text: "third" },
    ]);
    connection.close();
  });
});
