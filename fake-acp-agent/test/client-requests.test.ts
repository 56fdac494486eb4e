import { createHash } from "node:crypto";
import { join } from "node:path";
import type { RequestPermissionResponse } from "@agentclientprotocol/sdk";
import { afterEach, describe, expect, test } from "vitest";
import { cleanup, readLedger, startAgent, tempDir } from "./harness.js";

afterEach(cleanup);

function withLedger() {
  const ledger = join(tempDir(), "ledger.jsonl");
  return { ledger, agent: startAgent(["--ledger", ledger]) };
}

async function until(condition: () => boolean): Promise<void> {
  while (!condition()) await new Promise((r) => setTimeout(r, 10));
}

describe("permission", () => {
  test("asks with allow_once / allow_always / reject_once for the pending tool call", async () => {
    const { agent } = withLedger();
    const sessionId = await agent.start("/work/projects/demo");
    await agent.prompt(sessionId, "scenario: permission");
    expect(agent.permissionRequests).toEqual([
      {
        sessionId,
        toolCall: { toolCallId: "call-perm-1", title: "Edit src/math.js", kind: "edit", status: "pending" },
        options: [
          { optionId: "allow_once", name: "Allow once", kind: "allow_once" },
          { optionId: "allow_always", name: "Allow always", kind: "allow_always" },
          { optionId: "reject_once", name: "Reject", kind: "reject_once" },
        ],
      },
    ]);
    expect(agent.updates[0]).toMatchObject({
      sessionUpdate: "tool_call",
      toolCallId: "call-perm-1",
      status: "pending",
    });
    await agent.stop();
  });

  test.each(["allow_once", "allow_always", "reject_once"])(
    "a selected %s is recorded, named in a message, and the turn ends",
    async (optionId) => {
      const { agent, ledger } = withLedger();
      agent.onPermission(async () => ({ outcome: { outcome: "selected", optionId } }));
      const sessionId = await agent.start();
      expect(await agent.prompt(sessionId, "scenario: permission")).toEqual({ stopReason: "end_turn" });
      expect(agent.messageText()).toBe(`Permission outcome: selected option ${optionId}.`);
      expect(readLedger(ledger).slice(1)).toEqual([
        { event: "permission_outcome", outcome: "selected", option_id: optionId },
      ]);
      await agent.stop();
    },
  );

  test("a cancelled outcome (then session/cancel, as ACP clients do) ends the turn cancelled", async () => {
    const { agent, ledger } = withLedger();
    const sessionId = await agent.start();
    agent.onPermission(async () => ({ outcome: { outcome: "cancelled" } }));
    const response = agent.prompt(sessionId, "scenario: permission");
    await agent.until(() => agent.permissionRequests.length === 1);
    await agent.cancel(sessionId);
    expect(await response).toEqual({ stopReason: "cancelled" });
    expect(readLedger(ledger).slice(1)).toEqual([{ event: "permission_outcome", outcome: "cancelled" }]);
    await agent.stop();
  });

  test("session/cancel while the permission stays unanswered still ends the turn cancelled", async () => {
    const { agent, ledger } = withLedger();
    let answer: (response: RequestPermissionResponse) => void = () => {};
    agent.onPermission(() => new Promise((resolve) => (answer = resolve)));
    const sessionId = await agent.start();
    const response = agent.prompt(sessionId, "scenario: permission");
    await agent.until(() => agent.permissionRequests.length === 1);
    await agent.cancel(sessionId);
    // The agent waits a bounded grace (1 s) for the answer ACP requires, then gives up on it.
    expect(await response).toEqual({ stopReason: "cancelled" });
    answer({ outcome: { outcome: "selected", optionId: "allow_once" } });
    await until(() => readLedger(ledger).length === 2);
    expect(readLedger(ledger)[1]).toEqual({
      event: "permission_outcome",
      outcome: "selected",
      option_id: "allow_once",
    });
    await agent.stop();
  });

  test("an answer that arrives right after session/cancel is recorded before the cancelled response", async () => {
    const { agent, ledger } = withLedger();
    let answer: (response: RequestPermissionResponse) => void = () => {};
    agent.onPermission(() => new Promise((resolve) => (answer = resolve)));
    const sessionId = await agent.start();
    const response = agent.prompt(sessionId, "scenario: permission");
    await agent.until(() => agent.permissionRequests.length === 1);
    await agent.cancel(sessionId);
    answer({ outcome: { outcome: "cancelled" } });
    expect(await response).toEqual({ stopReason: "cancelled" });
    expect(readLedger(ledger)[1]).toEqual({ event: "permission_outcome", outcome: "cancelled" });
    await agent.stop();
  });
});

describe("unsupported agent-to-client requests", () => {
  test.each([
    ["fs_request", "fs/read_text_file"],
    ["terminal_request", "terminal/create"],
  ])("%s sends %s, records the client's error code and ends the turn", async (name, method) => {
    const { agent, ledger } = withLedger();
    const sessionId = await agent.start();
    expect(await agent.prompt(sessionId, `scenario: ${name}`)).toEqual({ stopReason: "end_turn" });
    // The SDK client answers methods it has no handler for with -32601 (method not found).
    expect(readLedger(ledger).slice(1)).toEqual([{ event: "client_error", method, code: -32601 }]);
    expect(agent.messageText()).toBe(`${method} failed with JSON-RPC error -32601.`);
    await agent.stop();
  });
});

describe("ledger", () => {
  test("appends exactly one prompt line per session/prompt, before the turn runs", async () => {
    const { agent, ledger } = withLedger();
    const sessionId = await agent.start();
    const before = Date.now();
    await agent.prompt(sessionId, "first");
    await agent.prompt(sessionId, "scenario: stop reason=refusal");
    await expect(agent.prompt(sessionId, "scenario: prompt_error")).rejects.toMatchObject({ code: -32603 });
    const lines = readLedger(ledger);
    expect(lines.map((l) => l.event)).toEqual(["prompt", "prompt", "prompt"]);
    const sha = (text: string) => createHash("sha256").update(text).digest("hex");
    expect(lines[0]).toEqual({
      event: "prompt",
      at_ms: expect.any(Number),
      hr_ms: expect.any(Number),
      session_id: sessionId,
      prompt_sha256: sha("first"),
      pid: agent.child.pid,
    });
    expect(lines[0]!.at_ms).toBeGreaterThanOrEqual(before - 1);
    expect(lines[1]!.prompt_sha256).toBe(sha("scenario: stop reason=refusal"));
    await agent.stop();
  });

  test("hashes the concatenated text blocks of the prompt", async () => {
    const { agent, ledger } = withLedger();
    const sessionId = await agent.start();
    await agent.agent.request("session/prompt", {
      sessionId,
      prompt: [
        { type: "text", text: "scenario: hello " },
        { type: "resource_link", uri: "file:///x", name: "x" },
        { type: "text", text: "text=joined" },
      ],
    });
    expect(agent.messageText()).toBe("joined");
    const text = "scenario: hello text=joined";
    expect(readLedger(ledger)[0]!.prompt_sha256).toBe(createHash("sha256").update(text).digest("hex"));
    await agent.stop();
  });

  test("a session/prompt with invalid params is recorded before the SDK rejects it", async () => {
    const { agent, ledger } = withLedger();
    const sessionId = await agent.start();
    await expect(
      agent.agent.request<unknown, unknown>("session/prompt", { sessionId, prompt: "not a list" }),
    ).rejects.toMatchObject({ code: -32602 });
    expect(readLedger(ledger)).toEqual([
      expect.objectContaining({
        event: "prompt",
        session_id: sessionId,
        prompt_sha256: createHash("sha256").digest("hex"),
      }),
    ]);
    await agent.stop();
  });

  test("a prompt for an unknown session is still recorded, then rejected", async () => {
    const { agent, ledger } = withLedger();
    await agent.start();
    await expect(agent.prompt("no-such-session", "hi")).rejects.toMatchObject({ code: -32002 });
    expect(readLedger(ledger)).toHaveLength(1);
    await agent.stop();
  });
});
