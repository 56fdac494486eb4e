/**
 * What an agent's text can do once it leaves the Runner (issue 19 §3, issue
 * 12 §3): every string of every event is terminal-safe (no escape sequences,
 * no C0/C1 or bidi controls but newline and tab), and the agent's executable
 * path and its argv elements longer than 5 characters are redacted like
 * mapped env values. Units over the normalizer, then the real fake agent.
 */
import type { SessionUpdate } from "@agentclientprotocol/sdk";
import type { RunEvent, RunEventBody } from "@webcodex/protocol";
import { afterAll, describe, expect, test } from "vitest";
import { FAKE_AGENT_BIN } from "../../../../scripts/test-support/index.js";
import { EventNormalizer } from "../../src/events/normalize.js";
import { REDACTED, Redactor } from "../../src/events/redactor.js";
import { makeWorkspace, newManager, runToEnd, writeConfig } from "../support/harness.js";

/** Any character a terminal would act on, other than newline and tab. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
const RAW_CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/;

/** Every string anywhere in `value`, with its JSON path. */
function strings(value: unknown, path = "$"): [string, string][] {
  if (typeof value === "string") return [[path, value]];
  if (Array.isArray(value)) return value.flatMap((v, i) => strings(v, `${path}[${i}]`));
  if (value !== null && typeof value === "object") {
    return Object.entries(value).flatMap(([k, v]) => strings(v, `${path}.${k}`));
  }
  return [];
}

const unsafeStrings = (value: unknown) => strings(value).filter(([, s]) => RAW_CONTROL.test(s));

const ESC = "\u001b";
const ATTACK = `${ESC}]0;title\u0007${ESC}[2J${ESC}[1A${ESC}[2K\r✔ completed \u009b2J\u202Eevil\u202C${ESC}]8;;http://x/${ESC}\\link`;

describe("normalizer: terminal-safe text in every field", () => {
  test("messages, reasoning, plan, tool ids/titles, diff paths, terminal ids and permission options carry no controls", () => {
    const out: RunEventBody[] = [];
    const n = new EventNormalizer({
      projectRoot: "/work/p",
      redactor: new Redactor([], "/work/p"),
      emit: (b) => out.push(b),
    });
    const updates: SessionUpdate[] = [
      { sessionUpdate: "agent_message_chunk", content: { type: "text", text: `hi ${ATTACK}` } },
      { sessionUpdate: "agent_thought_chunk", content: { type: "text", text: `think ${ATTACK}` } },
      { sessionUpdate: "plan", entries: [{ content: `step ${ATTACK}`, priority: "high", status: "pending" }] },
      { sessionUpdate: "tool_call", toolCallId: `id${ATTACK}`, title: `t ${ATTACK}`, kind: "edit", status: "pending" },
      {
        sessionUpdate: "tool_call_update",
        toolCallId: `id${ATTACK}`,
        status: "completed",
        content: [
          { type: "diff", path: `/work/p/src/${ATTACK}.js`, oldText: null, newText: "x" },
          { type: "terminal", terminalId: `term${ATTACK}` },
        ],
      },
    ];
    for (const u of updates) n.handle(u);
    out.push(
      n.permissionEvent({
        sessionId: "s",
        toolCall: { toolCallId: `id${ATTACK}`, title: `perm ${ATTACK}` },
        options: [{ optionId: `o${ATTACK}`, name: `allow ${ATTACK}`, kind: "allow_once" }],
      }),
    );
    n.flush();
    expect(out.map((b) => b.kind)).toEqual([
      "agent_message",
      "reasoning",
      "plan",
      "tool_activity",
      "tool_activity",
      "file_change",
      "terminal_activity",
      "permission_request",
    ]);
    expect(unsafeStrings(out)).toEqual([]);
    // The text around the attacks is kept; only the controls (and their parameters) go; CR became a newline.
    expect(out[0]).toMatchObject({ kind: "agent_message", text: "hi \n✔ completed evillink" });
    expect(out[5]).toMatchObject({ kind: "file_change", path: "src/\n✔ completed evillink.js" });
  });

  test("session-state updates (mode, config options, commands, session title) carry no controls either", () => {
    const out: RunEventBody[] = [];
    const n = new EventNormalizer({
      projectRoot: "/work/p",
      redactor: new Redactor([], "/work/p"),
      emit: (b) => out.push(b),
    });
    const updates = [
      { sessionUpdate: "current_mode_update", currentModeId: `mode${ATTACK}` },
      {
        sessionUpdate: "config_option_update",
        configOptions: [
          {
            id: `model${ATTACK}`,
            name: `Model ${ATTACK}`,
            type: "select",
            currentValue: `big${ATTACK}`,
            options: [{ value: `big${ATTACK}`, name: `Big ${ATTACK}` }],
          },
        ],
      },
      {
        sessionUpdate: "available_commands_update",
        availableCommands: [{ name: `cmd${ATTACK}`, description: `d ${ATTACK}` }],
      },
      { sessionUpdate: "session_info_update", title: `Session ${ATTACK}` },
    ] as unknown as SessionUpdate[];
    for (const u of updates) n.handle(u);
    n.flush();
    expect(out.length).toBeGreaterThanOrEqual(4);
    expect(unsafeStrings(out)).toEqual([]);
  });

  test("a control character inside a secret does not let the secret past the redactor", () => {
    const out: RunEventBody[] = [];
    const n = new EventNormalizer({
      projectRoot: "/work/p",
      redactor: new Redactor(["hunter2-secret"]),
      emit: (b) => out.push(b),
    });
    n.handle({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: `x hunter2${ESC}[0m-secret y` } });
    n.flush();
    expect(out).toEqual([{ kind: "agent_message", text: `x ${REDACTED} y`, truncated: false }]);
  });
});

describe("Redactor.forAgent (issue 12 §3)", () => {
  test("redacts the executable path and argv elements longer than 5 characters, not shorter ones", () => {
    const r = Redactor.forAgent(
      { executable: "/opt/agents/bin/codex-acp", args: ["--model", "gpt-x", "--profile=private-profile", "-v"] },
      { API_KEY: "sk-live-123456" },
      "/srv/project",
    );
    expect(r.redact("ran /opt/agents/bin/codex-acp --model gpt-x -v --profile=private-profile sk-live-123456")).toBe(
      `ran ${REDACTED} ${REDACTED} gpt-x -v ${REDACTED} ${REDACTED}`,
    );
  });

  test("an argv element that is the project root is made relative like the root, not redacted", () => {
    const r = Redactor.forAgent({ executable: "/usr/bin/agent", args: ["--cwd", "/srv/project/"] }, {}, "/srv/project");
    expect(r.redact("edited /srv/project/src/a.js")).toBe("edited src/a.js");
  });
});

describe("against the real fake agent", () => {
  const ws = makeWorkspace();
  const config = writeConfig(ws, {
    agents: [{ id: "fake", executable: FAKE_AGENT_BIN, args: ["--ledger", ws.ledger] }],
  });
  const { manager } = newManager(config);
  afterAll(async () => {
    await manager.close();
    ws.cleanup();
  });

  test("the escapes scenario's terminal attacks reach no event field; the text around them does", async () => {
    const { run, events } = await runToEnd(manager, "scenario: escapes");
    expect(run.state).toBe("completed");
    expect(unsafeStrings(events)).toEqual([]);
    const text = events
      .filter((e): e is Extract<RunEvent, { kind: "agent_message" }> => e.kind === "agent_message")
      .map((e) => e.text)
      .join("");
    for (const marker of ["[osc_title]", "[osc8_link]click here", "[clear_screen]", "[forged_completed]", "[bidi]"]) {
      expect(text).toContain(marker);
    }
    expect(text).not.toContain("pwned-window-title");
    expect(text).not.toContain("evil.example");
    const kinds = new Set(events.map((e) => e.kind));
    for (const kind of ["reasoning", "plan", "tool_activity", "file_change", "terminal_activity"]) {
      expect(kinds).toContain(kind);
    }
  });

  test("the agent's executable path and long argv elements never reach events (echo_argv)", async () => {
    const { run, events } = await runToEnd(manager, "scenario: echo_argv");
    expect(run.state).toBe("completed");
    const text = JSON.stringify(events);
    expect(text).not.toContain(FAKE_AGENT_BIN);
    expect(text).not.toContain(ws.ledger);
    expect(text).not.toContain("--ledger");
    expect(text).toContain(`argv: ${REDACTED} ${REDACTED} ${REDACTED} (end)`);
  });
});
