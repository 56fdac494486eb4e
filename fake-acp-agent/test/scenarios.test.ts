import type { SessionUpdate, ToolCallContent } from "@agentclientprotocol/sdk";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { type AgentUnderTest, cleanup, type SessionView, startAgent } from "./harness.js";

// One agent process serves every test here, each in its own session (spawning costs ~0.3 s of CPU).
let shared: AgentUnderTest;
beforeAll(async () => {
  shared = startAgent([], { PATH: process.env.PATH ?? "/usr/bin", FAKE_SECRET: "s3cret-value-123" });
  await shared.initialize();
});
afterAll(async () => {
  expect(await shared.stop()).toEqual({ code: 0, signal: null });
  await cleanup();
});

const session = (cwd?: string): Promise<SessionView> => shared.session(cwd);

const kinds = (updates: readonly SessionUpdate[]) => updates.map((u) => u.sessionUpdate);

describe("hello", () => {
  test("a prompt without a scenario line streams a greeting in 3+ chunks and ends the turn", async () => {
    const agent = await session();
    expect(await agent.prompt("Please fix the bug.\nscenario: hang")).toEqual({ stopReason: "end_turn" });
    expect(agent.updates.length).toBeGreaterThanOrEqual(3);
    expect(new Set(kinds(agent.updates))).toEqual(new Set(["agent_message_chunk"]));
    expect(agent.messageText()).toBe("Hello from fake-acp-agent! This turn was streamed in chunks.");
  });

  test.each([
    ['scenario: hello text="Hi there, world"', "Hi there, world"],
    ["scenario: hello text=ab", "ab"],
  ])("%s streams exactly the given text", async (prompt, text) => {
    const agent = await session();
    await agent.prompt(prompt);
    expect(agent.updates.length).toBeGreaterThanOrEqual(3);
    expect(agent.messageText()).toBe(text);
  });
});

test("tools streams plan, edit tool call with diffs, execute tool call with terminal, thought, message and usage", async () => {
  const cwd = "/work/projects/demo";
  const agent = await session(cwd);
  expect(await agent.prompt("scenario: tools")).toEqual({ stopReason: "end_turn" });
  expect(kinds(agent.updates)).toEqual([
    "plan",
    "tool_call",
    "tool_call_update",
    "tool_call_update",
    "tool_call",
    "tool_call_update",
    "agent_thought_chunk",
    "agent_message_chunk",
    "agent_message_chunk",
    "usage_update",
  ]);
  const [plan, edit, editProgress, editDone, exec, , , , , usage] = agent.updates;
  expect(plan).toMatchObject({ entries: [{}, {}, {}] });
  expect(edit).toMatchObject({ toolCallId: "call-edit-1", kind: "edit", status: "pending" });
  expect(editProgress).toMatchObject({ toolCallId: "call-edit-1", status: "in_progress" });
  expect(editDone).toMatchObject({ toolCallId: "call-edit-1", status: "completed" });
  const diffs = (editDone as { content: ToolCallContent[] }).content;
  expect(diffs.map((c) => c.type === "diff" && c.path)).toEqual([`${cwd}/src/math.js`, "/etc/outside-project.txt"]);
  expect(exec).toMatchObject({ kind: "execute", content: [{ type: "terminal", terminalId: "term-1" }] });
  expect(usage).toEqual({
    sessionUpdate: "usage_update",
    used: 1234,
    size: 200000,
    cost: { amount: 0.0042, currency: "USD" },
  });
});

describe("burst", () => {
  test("count=2000 chunk=16 sends 2000 agent_message_chunks of 16 bytes, then end_turn", async () => {
    const agent = await session();
    expect(await agent.prompt("scenario: burst count=2000 chunk=16")).toEqual({ stopReason: "end_turn" });
    expect(agent.updates).toHaveLength(2000);
    for (const update of agent.updates) {
      expect(update.sessionUpdate === "agent_message_chunk" && update.content.type === "text").toBe(true);
      if (update.sessionUpdate === "agent_message_chunk" && update.content.type === "text") {
        expect(Buffer.byteLength(update.content.text)).toBe(16);
      }
    }
  });

  test("kind=tool alternates tool_call and tool_call_update", async () => {
    const agent = await session();
    await agent.prompt("scenario: burst count=10 chunk=4 kind=tool");
    expect(kinds(agent.updates)).toEqual(Array.from({ length: 5 }, () => ["tool_call", "tool_call_update"]).flat());
    expect(agent.updates[9]).toMatchObject({ toolCallId: "burst-4", status: "completed" });
  });

  test("session/cancel stops a burst with stopReason cancelled", async () => {
    const agent = await session();
    const response = agent.prompt("scenario: burst count=10000000 chunk=1");
    await agent.until((view) => view.updates.length >= 100);
    await agent.cancel();
    expect(await response).toEqual({ stopReason: "cancelled" });
    expect(agent.updates.length).toBeLessThan(10_000_000);
  });

  test("the default is 1000 chunks of 32 bytes", async () => {
    const agent = await session();
    await agent.prompt("scenario: burst");
    expect(agent.updates).toHaveLength(1000);
    expect(agent.messageText()).toHaveLength(32_000);
  });
});

describe("slow", () => {
  test("streams one indexed tick per interval, then ends the turn", async () => {
    const agent = await session();
    expect(await agent.prompt("scenario: slow interval_ms=1 count=5")).toEqual({ stopReason: "end_turn" });
    expect(agent.messageText()).toBe("tick 0\ntick 1\ntick 2\ntick 3\ntick 4\n");
  });

  test("session/cancel stops the stream and answers the pending prompt with cancelled", async () => {
    const agent = await session();
    const response = agent.prompt("scenario: slow interval_ms=50 count=100000");
    await agent.until((view) => view.updates.length >= 2);
    await agent.cancel();
    expect(await response).toEqual({ stopReason: "cancelled" });
    const ticks = agent.updates.length;
    expect(ticks).toBeLessThan(100000);
    // The session stays usable after a cancelled turn.
    expect(await agent.prompt("scenario: hello")).toEqual({ stopReason: "end_turn" });
  });
});

test.each(["max_tokens", "max_turn_requests", "refusal", "cancelled", "end_turn", "bogus"])(
  "stop reason=%s returns that stopReason verbatim",
  async (reason) => {
    const agent = await session();
    expect(await agent.prompt(`scenario: stop reason=${reason}`)).toEqual({ stopReason: reason });
    expect(agent.updates).toEqual([]);
  },
);

test("prompt_error answers session/prompt with JSON-RPC error -32603", async () => {
  const agent = await session();
  await expect(agent.prompt("scenario: prompt_error")).rejects.toMatchObject({
    code: -32603,
    message: "fake prompt failure",
  });
  // The session survives a failed prompt.
  expect(await agent.prompt("scenario: stop reason=end_turn")).toEqual({ stopReason: "end_turn" });
});

test("echo_env puts the variable's value into an agent message", async () => {
  const agent = await session();
  await agent.prompt("scenario: echo_env name=FAKE_SECRET");
  expect(agent.messageText()).toBe("value of FAKE_SECRET: s3cret-value-123");
  await agent.prompt("scenario: echo_env name=NOT_SET_ANYWHERE");
  expect(agent.messageText()).toContain("value of NOT_SET_ANYWHERE: (unset)");
});

test("ignored_updates sends user_message_chunk and an updatedAt-only session_info_update, then one message", async () => {
  const agent = await session();
  expect(await agent.prompt("scenario: ignored_updates")).toEqual({ stopReason: "end_turn" });
  expect(kinds(agent.updates)).toEqual(["user_message_chunk", "session_info_update", "agent_message_chunk"]);
});

test("agent_state sends each session-state update, the config snapshot twice, and a [MODE_UPDATE] chunk", async () => {
  const agent = await session();
  expect(await agent.prompt("scenario: agent_state")).toEqual({ stopReason: "end_turn" });
  expect(kinds(agent.updates)).toEqual([
    "current_mode_update",
    "config_option_update",
    "config_option_update",
    "available_commands_update",
    "session_info_update",
    "agent_message_chunk",
    "agent_message_chunk",
  ]);
  expect(agent.messageText()).toContain("[MODE_UPDATE] autoEdit");
});

test("replay plays a stored real-agent sequence with the session's cwd and the fixture's stop reason", async () => {
  const agent = await session();
  expect(await agent.prompt("scenario: replay fixture=codex-exec-turn")).toEqual({ stopReason: "end_turn" });
  expect(kinds(agent.updates)).toEqual([
    "usage_update",
    "tool_call",
    "tool_call_update",
    "tool_call_update",
    "tool_call_update",
    "usage_update",
    "usage_update",
    "agent_message_chunk",
  ]);
  const recorded = await session();
  expect(await recorded.prompt("scenario: replay fixture=claude-no-credentials")).toEqual({ stopReason: "end_turn" });
  expect(kinds(recorded.updates)).toEqual([
    "available_commands_update",
    "current_mode_update",
    "available_commands_update",
  ]);
  expect(await agent.prompt("scenario: replay fixture=nope")).toEqual({ stopReason: "end_turn" });
  expect(agent.messageText()).toContain("No readable fixture nope.");
});

describe("bad scenario lines", () => {
  test("an unknown scenario ends the turn naming it and every valid scenario", async () => {
    const agent = await session();
    expect(await agent.prompt("scenario: nope")).toEqual({ stopReason: "end_turn" });
    const text = agent.messageText();
    expect(text).toContain('Unknown scenario "nope"');
    for (const name of [
      "hello",
      "tools",
      "burst",
      "slow",
      "permission",
      "stop",
      "prompt_error",
      "crash_before_response",
      "crash_after_response",
      "malformed",
      "oversized",
      "hang",
      "fs_request",
      "terminal_request",
      "grandchild",
      "echo_env",
      "ignored_updates",
    ]) {
      expect(text).toContain(name);
    }
  });

  test.each([
    ["scenario: burst count=lots", "count"],
    ["scenario: burst colour=red", "colour"],
    ["scenario: stop", "reason"],
    ["scenario: slow fast", "fast"],
  ])("%s ends the turn naming the bad parameter", async (prompt, name) => {
    const agent = await session();
    expect(await agent.prompt(prompt)).toEqual({ stopReason: "end_turn" });
    expect(agent.messageText()).toMatch(/^Invalid parameters for scenario \w+: /);
    expect(agent.messageText()).toContain(name);
  });
});
