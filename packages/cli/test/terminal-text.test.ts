/**
 * The CLI escapes what came from the Server before printing it (issue 19 §3,
 * defence in depth: the Runner already strips controls, the CLI does not rely
 * on it). Raw terminal attacks in every Server-provided field go through each
 * renderer; the output holds no raw control character, piped (plain) or as
 * ndjson, and the attacks stay visible as escapes.
 */
import { describe, expect, it } from "vitest";
import {
  initialRenderState,
  renderCancel,
  renderError,
  renderObservation,
  renderProjects,
  renderStarted,
} from "../src/render.js";
import { renderSummary } from "../src/render-summary.js";
import { JSON_STYLE, PLAIN, type Style } from "../src/style.js";
import { escapeControls, escapeDeep, safeJsonLine } from "../src/terminal-text.js";
import type { Observation } from "../src/wire.js";

// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
const RAW_CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/;
const ESC = "\u001b";
const X = `${ESC}]0;owned${"\u0007"}${ESC}[2J${ESC}[1A${ESC}[2K\r✔ completed\u009b2J\u202Eevil`;

const observation: Observation = {
  run_id: `wc_agent_run_${X}`,
  state: "completed",
  execution_state: `completed${X}`,
  stop_reason: `end_turn${X}`,
  failure_kind: `kind${X}`,
  recovery_kind: `none${X}`,
  message: `message ${X}`,
  observation_token: "t",
  history_lost: false,
  has_more: false,
  runner_offline: undefined,
  started_at: undefined,
  ended_at: undefined,
  events: [
    { seq: 1, at: "t", kind: "agent_message", text: `hello ${X}`, truncated: false },
    { seq: 2, at: "t", kind: "reasoning", text: `think ${X}`, truncated: false },
    {
      seq: 3,
      at: "t",
      kind: "plan",
      entries: [{ content: `step ${X}`, status: "pending", priority: `medium${X}` }],
      truncated: false,
    },
    {
      seq: 4,
      at: "t",
      kind: "tool_activity",
      tool_call_id: `id${X}`,
      title: `title ${X}`,
      tool_kind: `edit${X}`,
      status: "completed",
    },
    { seq: 5, at: "t", kind: "file_change", tool_call_id: `id${X}`, path: `src/${X}.js` },
    { seq: 6, at: "t", kind: "terminal_activity", tool_call_id: `id${X}`, terminal_id: `term${X}` },
    { seq: 7, at: "t", kind: "usage", used_tokens: 1, context_size: 2, cost_amount: 0.1, cost_currency: `USD${X}` },
    {
      seq: 8,
      at: "t",
      kind: "permission_request",
      tool_call_id: `id${X}`,
      title: `perm ${X}`,
      options: [{ option_id: `opt${X}`, name: `allow ${X}`, kind: `allow_once${X}` }],
    },
    { seq: 9, at: "t", kind: "other", original_kind: `future${X}` },
  ],
};

function renderAll(style: Style): string {
  let text = renderStarted(
    {
      run_id: `wc_agent_run_${X}`,
      state: "running",
      execution_state: `started${X}`,
      replayed: false,
      observation_token: "t",
    },
    { project: "demo", provider: "fake", key: "k", keyGenerated: true },
    style,
  );
  const rendered = renderObservation(initialRenderState(), observation, style);
  text += rendered.text;
  text += renderSummary(rendered.state, observation, { durationMs: 1000 }, style);
  text += renderCancel({ run_id: `r${X}`, state: "running", cancel_requested: true, already_terminal: false }, style);
  text += renderProjects(
    [
      {
        project_id: `p${X}`,
        runner_online: true,
        allow_patch: true,
        providers: [{ provider_id: `f${X}`, name: `Fake ${X}`, allowed_config_options: [`model${X}`] }],
      },
    ],
    "http://127.0.0.1/mcp",
    style,
  );
  text += renderError({ code: "tool", message: `bad ${X}`, hint: `hint ${X}` }, style);
  return text;
}

describe("CLI output of Server text", () => {
  it("plain text (piped) carries no raw control character; the attacks show as escapes", () => {
    const text = renderAll(PLAIN);
    expect(text).not.toMatch(RAW_CONTROL);
    expect(text).toContain("hello \\x1b]0;owned\\x07\\x1b[2J\\x1b[1A\\x1b[2K\\x0d✔ completed\\x9b2J\\u202eevil");
    expect(text).toContain("title \\x1b]0;owned");
    expect(text).toContain("src/\\x1b]0;owned");
  });

  it("on a colour TTY only the CLI's own SGR colour codes remain", () => {
    const text = renderAll({ mode: "text", color: true });
    // biome-ignore lint/suspicious/noControlCharactersInRegex: the CLI's own colour codes
    const withoutOwnColours = text.replace(/\u001b\[\d+m/g, "");
    expect(withoutOwnColours).not.toMatch(RAW_CONTROL);
  });

  it("ndjson carries no raw control character and a JSON reader gets the original strings back", () => {
    const text = renderAll(JSON_STYLE);
    expect(text).not.toMatch(RAW_CONTROL);
    const lines = text
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    const message = lines.find((l) => l.type === "event" && l.kind === "agent_message");
    expect(message?.text).toBe(`hello ${X}`);
  });

  it("escapeControls keeps newlines, tabs and ordinary Unicode; escapeDeep reaches nested strings", () => {
    expect(escapeControls("a\n\tb ✓ 日本")).toBe("a\n\tb ✓ 日本");
    expect(escapeDeep({ a: [`x${ESC}`], b: 1, c: null })).toEqual({ a: ["x\\x1b"], b: 1, c: null });
    expect(safeJsonLine({ s: "\u009b\u202e\u2028" })).toBe('{"s":"\\u009b\\u202e\\u2028"}\n');
  });
});
