import { createHash } from "node:crypto";
import { join } from "node:path";
import type { RequestPermissionResponse } from "@agentclientprotocol/sdk";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import {
  DAEMON_WAIT_MS,
  IN_PROCESS_POLL_MS,
  type LedgerLine,
  poll,
  readLedger,
} from "../../scripts/test-support/index.js";
import { type AgentUnderTest, cleanup, startAgent, tempDir } from "./harness.js";

// One agent process with one ledger serves every test here; tests run in order,
// so each one looks only at the ledger lines appended since it started.
let shared: AgentUnderTest;
let ledgerFile: string;
let mark = 0;
beforeAll(async () => {
  ledgerFile = join(tempDir(), "ledger.jsonl");
  shared = startAgent(["--ledger", ledgerFile]);
  await shared.initialize();
});
beforeEach(() => {
  mark = readLedger(ledgerFile).length;
});
afterAll(async () => {
  expect(await shared.stop()).toEqual({ code: 0, signal: null });
  await cleanup();
});

/** Ledger lines appended since the current test started. */
function ledger(): LedgerLine[] {
  return readLedger(ledgerFile).slice(mark);
}

const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");

describe("permission", () => {
  test("asks with allow_once / allow_always / reject_once for the pending tool call", async () => {
    const session = await shared.session("/work/projects/demo");
    await session.prompt("scenario: permission");
    expect(session.permissionRequests).toEqual([
      {
        sessionId: session.id,
        toolCall: { toolCallId: "call-perm-1", title: "Edit src/math.js", kind: "edit", status: "pending" },
        options: [
          { optionId: "allow_once", name: "Allow once", kind: "allow_once" },
          { optionId: "allow_always", name: "Allow always", kind: "allow_always" },
          { optionId: "reject_once", name: "Reject", kind: "reject_once" },
        ],
      },
    ]);
    expect(session.updates[0]).toMatchObject({
      sessionUpdate: "tool_call",
      toolCallId: "call-perm-1",
      status: "pending",
      locations: [{ path: "/work/projects/demo/src/math.js" }],
    });
  });

  test.each(["allow_once", "allow_always", "reject_once"])(
    "a selected %s is recorded, named in a message, and the turn ends",
    async (optionId) => {
      const session = await shared.session();
      session.onPermission(async () => ({ outcome: { outcome: "selected", optionId } }));
      expect(await session.prompt("scenario: permission")).toEqual({ stopReason: "end_turn" });
      expect(session.messageText()).toBe(`Permission outcome: selected option ${optionId}.`);
      expect(ledger().slice(1)).toEqual([{ event: "permission_outcome", outcome: "selected", option_id: optionId }]);
    },
  );

  test("a cancelled outcome (then session/cancel, as ACP clients do) ends the turn cancelled", async () => {
    const session = await shared.session();
    session.onPermission(async () => ({ outcome: { outcome: "cancelled" } }));
    const response = session.prompt("scenario: permission");
    await session.until((s) => s.permissionRequests.length === 1);
    await poll(() => ledger().length === 2, { timeoutMs: DAEMON_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS }); // the answer has arrived; then the client cancels
    await session.cancel();
    expect(await response).toEqual({ stopReason: "cancelled" });
    await poll(() => ledger().length === 3, { timeoutMs: DAEMON_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    expect(ledger().slice(1)).toEqual([
      { event: "permission_outcome", outcome: "cancelled" },
      { event: "cancel", session_id: session.id, pid: shared.child.pid },
    ]);
  });

  test("an answer that arrives right after session/cancel is recorded before the cancelled response", async () => {
    const session = await shared.session();
    let answer: (response: RequestPermissionResponse) => void = () => {};
    session.onPermission(() => new Promise((resolve) => (answer = resolve)));
    const response = session.prompt("scenario: permission");
    await session.until((s) => s.permissionRequests.length === 1);
    await session.cancel();
    answer({ outcome: { outcome: "cancelled" } });
    expect(await response).toEqual({ stopReason: "cancelled" });
    expect(ledger().slice(1)).toEqual([
      { event: "cancel", session_id: session.id, pid: shared.child.pid },
      { event: "permission_outcome", outcome: "cancelled" },
    ]);
  });

  test("session/cancel while the permission stays unanswered still ends the turn cancelled", async () => {
    const session = await shared.session();
    let answer: (response: RequestPermissionResponse) => void = () => {};
    session.onPermission(() => new Promise((resolve) => (answer = resolve)));
    const response = session.prompt("scenario: permission");
    await session.until((s) => s.permissionRequests.length === 1);
    await session.cancel();
    // The agent waits a bounded grace (1 s) for the answer ACP requires, then gives up on it.
    expect(await response).toEqual({ stopReason: "cancelled" });
    answer({ outcome: { outcome: "selected", optionId: "allow_once" } });
    await poll(() => ledger().length === 3, { timeoutMs: DAEMON_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    expect(ledger().slice(1)).toEqual([
      { event: "cancel", session_id: session.id, pid: shared.child.pid },
      { event: "permission_outcome", outcome: "selected", option_id: "allow_once" },
    ]);
  });
});

describe("permission_flood", () => {
  test("sends count concurrent requests, records every outcome, and ends cancelled if any was cancelled", async () => {
    const session = await shared.session();
    let n = 0;
    session.onPermission(async () =>
      n++ % 2 === 0
        ? { outcome: { outcome: "cancelled" } }
        : { outcome: { outcome: "selected", optionId: "reject_once" } },
    );
    expect(await session.prompt("scenario: permission_flood count=6")).toEqual({ stopReason: "cancelled" });
    expect(session.permissionRequests.map((r) => r.toolCall.toolCallId).sort()).toEqual(
      Array.from({ length: 6 }, (_, i) => `call-flood-${i}`).sort(),
    );
    const outcomes = ledger().slice(1);
    expect(outcomes).toHaveLength(6);
    expect(outcomes.filter((l) => l.outcome === "cancelled")).toHaveLength(3);
  });

  test("ends the turn end_turn when every request was answered with an option", async () => {
    const session = await shared.session();
    session.onPermission(async () => ({ outcome: { outcome: "selected", optionId: "reject_once" } }));
    expect(await session.prompt("scenario: permission_flood count=3")).toEqual({ stopReason: "end_turn" });
    expect(ledger().slice(1)).toHaveLength(3);
  });
});

describe("unsupported agent-to-client requests", () => {
  test.each([
    ["fs_request", "fs/read_text_file"],
    ["terminal_request", "terminal/create"],
  ])("%s sends %s, records the client's error code and ends the turn", async (name, method) => {
    const session = await shared.session();
    expect(await session.prompt(`scenario: ${name}`)).toEqual({ stopReason: "end_turn" });
    // The SDK client answers methods it has no handler for with -32601 (method not found).
    expect(ledger().slice(1)).toEqual([{ event: "client_error", method, code: -32601 }]);
    expect(session.messageText()).toBe(`${method} failed with JSON-RPC error -32601.`);
  });
});

describe("ledger", () => {
  test("appends exactly one prompt line per session/prompt, before the turn runs", async () => {
    const session = await shared.session();
    const before = Date.now();
    await session.prompt("first");
    await session.prompt("scenario: stop reason=refusal");
    await expect(session.prompt("scenario: prompt_error")).rejects.toMatchObject({ code: -32603 });
    const lines = ledger();
    expect(lines.map((l) => l.event)).toEqual(["prompt", "prompt", "prompt"]);
    expect(lines[0]).toEqual({
      event: "prompt",
      at_ms: expect.any(Number),
      hr_ms: expect.any(Number),
      session_id: session.id,
      prompt_sha256: sha256("first"),
      pid: shared.child.pid,
    });
    expect(lines[0]!.at_ms).toBeGreaterThanOrEqual(before - 1);
    expect(lines[1]!.prompt_sha256).toBe(sha256("scenario: stop reason=refusal"));
    expect(lines[2]!.prompt_sha256).toBe(sha256("scenario: prompt_error"));
  });

  test("hashes the concatenated text blocks of the prompt", async () => {
    const session = await shared.session();
    await shared.agent.request("session/prompt", {
      sessionId: session.id,
      prompt: [
        { type: "text", text: "scenario: hello " },
        { type: "resource_link", uri: "file:///x", name: "x" },
        { type: "text", text: "text=joined" },
      ],
    });
    expect(session.messageText()).toBe("joined");
    expect(ledger()).toEqual([expect.objectContaining({ prompt_sha256: sha256("scenario: hello text=joined") })]);
  });

  test("a session/prompt with invalid params is recorded before the SDK rejects it", async () => {
    const session = await shared.session();
    await expect(
      shared.agent.request<unknown, unknown>("session/prompt", { sessionId: session.id, prompt: "not a list" }),
    ).rejects.toMatchObject({ code: -32602 });
    expect(ledger()).toEqual([
      expect.objectContaining({ event: "prompt", session_id: session.id, prompt_sha256: sha256("") }),
    ]);
  });

  test("a prompt for an unknown session is still recorded, then rejected with -32002", async () => {
    await expect(shared.prompt("no-such-session", "hi")).rejects.toMatchObject({ code: -32002 });
    expect(ledger()).toEqual([expect.objectContaining({ event: "prompt", session_id: "no-such-session" })]);
  });
});
