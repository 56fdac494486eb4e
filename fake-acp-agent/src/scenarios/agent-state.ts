import { readFileSync } from "node:fs";
import type { PromptResponse, RequestPermissionRequest, SessionUpdate } from "@agentclientprotocol/sdk";
import { z } from "zod";
import { CANCELLED, END_TURN, noParams, type Scenario, say, scenario, type Turn, update } from "../turn.js";

/**
 * Each of ACP v1's session-state updates once: `current_mode_update`,
 * `config_option_update` (then the same snapshot again, which a client may
 * drop as unchanged), `available_commands_update`, `session_info_update`,
 * and Gemini CLI's `[MODE_UPDATE] <mode>` message chunk.
 */
export const agentState: Scenario = scenario("agent_state", noParams, async (turn) => {
  await update(turn, { sessionUpdate: "current_mode_update", currentModeId: "code" });
  const configOptions = turn.session.config.isEmpty
    ? [
        {
          type: "select" as const,
          id: "mode",
          name: "Mode",
          category: "mode",
          currentValue: "code",
          options: [
            { value: "ask", name: "Ask" },
            { value: "code", name: "Code" },
          ],
        },
      ]
    : turn.session.config.toOptions();
  await update(turn, { sessionUpdate: "config_option_update", configOptions });
  await update(turn, { sessionUpdate: "config_option_update", configOptions });
  await update(turn, {
    sessionUpdate: "available_commands_update",
    availableCommands: [
      { name: "review", description: "Review the working tree" },
      { name: "compact", description: "Summarize the conversation", input: { hint: "optional focus" } },
    ],
  });
  await update(turn, { sessionUpdate: "session_info_update", title: "Fix add() in src/math.js" });
  await update(turn, {
    sessionUpdate: "agent_message_chunk",
    content: { type: "text", text: "[MODE_UPDATE] autoEdit" },
  });
  await say(turn, "Sent every session-state update.");
  return END_TURN;
});

const FIXTURES = new URL("../../fixtures/updates/", import.meta.url);

const Step = z.union([
  z.object({ update: z.record(z.string(), z.unknown()) }).strict(),
  z.object({ permission: z.record(z.string(), z.unknown()) }).strict(),
]);
const Fixture = z
  .object({ agent: z.string(), source: z.string(), steps: z.array(Step), stopReason: z.string() })
  .strict();
export type UpdateFixture = z.infer<typeof Fixture>;

/** Reads `fixtures/updates/NAME.json`, with every `<cwd>` replaced by `cwd`. */
export function loadUpdateFixture(name: string, cwd: string): UpdateFixture {
  const text = readFileSync(new URL(`${name}.json`, FIXTURES), "utf8").replaceAll("<cwd>", cwd);
  return Fixture.parse(JSON.parse(text));
}

/**
 * Plays a stored update sequence of a real agent (fixtures/updates/*.json):
 * each `update` step as a session/update, each `permission` step as a
 * session/request_permission awaited to its answer (`cancelled` ends the
 * turn `cancelled`), then the fixture's stop reason.
 */
export const replay: Scenario = scenario(
  "replay fixture=claude-edit-turn",
  z.object({ fixture: z.string().regex(/^[a-z0-9-]{1,64}$/, "expected a fixture name") }).strict(),
  async (turn: Turn, { fixture }) => {
    let loaded: UpdateFixture;
    try {
      loaded = loadUpdateFixture(fixture, turn.session.cwd);
    } catch {
      await say(turn, `No readable fixture ${fixture}.`);
      return END_TURN;
    }
    for (const step of loaded.steps) {
      if (turn.cancelled.aborted) return CANCELLED;
      if ("update" in step) {
        await update(turn, step.update as SessionUpdate);
        continue;
      }
      const request = { ...step.permission, sessionId: turn.session.id } as RequestPermissionRequest;
      const response = await turn.client.request("session/request_permission", request);
      if (response.outcome.outcome === "cancelled" && turn.cancelled.aborted) return CANCELLED;
    }
    return { stopReason: loaded.stopReason } as PromptResponse;
  },
);
