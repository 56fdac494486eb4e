import { join } from "node:path";
import type { PromptResponse } from "@agentclientprotocol/sdk";
import { z } from "zod";
import { END_TURN, noParams, type Scenario, say, scenario, update } from "../turn.js";

const DEFAULT_GREETING = "Hello from fake-acp-agent! This turn was streamed in chunks.";

/** Splits text into at least three chunks (by word when possible). */
function chunks(text: string): string[] {
  const words = text.match(/\s*\S+\s*/g) ?? [];
  if (words.length >= 3) return words;
  const third = Math.ceil(text.length / 3);
  return [text.slice(0, third), text.slice(third, 2 * third), text.slice(2 * third)];
}

export const hello: Scenario = scenario(
  'hello text="Hi there, world"',
  z.object({ text: z.string().optional() }).strict(),
  async (turn, { text }) => {
    for (const chunk of chunks(text ?? DEFAULT_GREETING)) await say(turn, chunk);
    return END_TURN;
  },
);

export const tools: Scenario = scenario("tools", noParams, async (turn) => {
  const insidePath = join(turn.session.cwd, "src", "math.js");
  await update(turn, {
    sessionUpdate: "plan",
    entries: [
      { content: "Read src/math.js", priority: "high", status: "completed" },
      { content: "Fix add()", priority: "high", status: "in_progress" },
      { content: "Run the tests", priority: "medium", status: "pending" },
    ],
  });
  await update(turn, {
    sessionUpdate: "tool_call",
    toolCallId: "call-edit-1",
    title: "Edit src/math.js",
    kind: "edit",
    status: "pending",
    locations: [{ path: insidePath }],
    rawInput: { path: insidePath },
  });
  await update(turn, { sessionUpdate: "tool_call_update", toolCallId: "call-edit-1", status: "in_progress" });
  await update(turn, {
    sessionUpdate: "tool_call_update",
    toolCallId: "call-edit-1",
    status: "completed",
    content: [
      {
        type: "diff",
        path: insidePath,
        oldText: "export const add = (a, b) => a - b;\n",
        newText: "export const add = (a, b) => a + b;\n",
      },
      { type: "diff", path: "/etc/outside-project.txt", oldText: null, newText: "outside the project\n" },
    ],
  });
  await update(turn, {
    sessionUpdate: "tool_call",
    toolCallId: "call-exec-1",
    title: "npm test",
    kind: "execute",
    status: "in_progress",
    content: [{ type: "terminal", terminalId: "term-1" }],
  });
  await update(turn, { sessionUpdate: "tool_call_update", toolCallId: "call-exec-1", status: "completed" });
  await update(turn, {
    sessionUpdate: "agent_thought_chunk",
    content: { type: "text", text: "The subtraction was a typo; the tests pass now." },
  });
  await say(turn, "I fixed add() in src/math.js ");
  await say(turn, "and the tests pass.");
  await update(turn, {
    sessionUpdate: "usage_update",
    used: 1234,
    size: 200000,
    cost: { amount: 0.0042, currency: "USD" },
  });
  return END_TURN;
});

export const echoEnv: Scenario = scenario(
  "echo_env name=HOME",
  z.object({ name: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "expected an environment variable name") }).strict(),
  async (turn, { name }) => {
    const value = process.env[name];
    await say(turn, value === undefined ? `value of ${name}: (unset)` : `value of ${name}: ${value}`);
    return END_TURN;
  },
);

export const ignoredUpdates: Scenario = scenario("ignored_updates", noParams, async (turn) => {
  await update(turn, { sessionUpdate: "user_message_chunk", content: { type: "text", text: "an echo of the prompt" } });
  // Only updatedAt moved: nothing a client would show.
  await update(turn, { sessionUpdate: "session_info_update", updatedAt: "2026-01-01T00:00:00Z" });
  await say(turn, "Sent two updates a client may ignore.");
  return END_TURN;
});

export const stop: Scenario = scenario(
  "stop reason=max_tokens",
  z.object({ reason: z.string().min(1) }).strict(),
  async (_turn, { reason }) => {
    // The SDK does not validate outgoing responses, so an unknown reason
    // (e.g. `bogus`) reaches the wire verbatim; the cast only silences the type.
    return { stopReason: reason } as PromptResponse;
  },
);
