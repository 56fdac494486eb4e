import { describe, expect, it } from "vitest";
import {
  initialRenderState,
  type RenderState,
  renderObservation,
  renderProjects,
  renderStarted,
} from "../src/render.js";
import { adviceFor, formatDuration, renderSummary } from "../src/render-summary.js";
import { JSON_STYLE, PLAIN, type Style, stripAnsi } from "../src/style.js";
import { type Observation, RUN_STATES, type RunState } from "../src/wire.js";
import { loadRecorded } from "./support.js";

function replay(observations: readonly Observation[], style: Style): { text: string; state: RenderState } {
  let state = initialRenderState();
  let text = "";
  for (const obs of observations) {
    const out = renderObservation(state, obs, style);
    state = out.state;
    text += out.text;
  }
  return { text, state };
}

function obs(partial: Partial<Observation> & Pick<Observation, "state">): Observation {
  return {
    run_id: "wc_agent_run_x",
    execution_state: "started",
    recovery_kind: "none",
    events: [],
    observation_token: "t",
    history_lost: false,
    has_more: false,
    stop_reason: undefined,
    failure_kind: undefined,
    message: undefined,
    runner_offline: undefined,
    started_at: undefined,
    ended_at: undefined,
    ...partial,
  };
}

describe("text rendering of a recorded tools run", () => {
  const recorded = loadRecorded("tools-run");

  it("renders plan, streamed message, one line per tool status change, file changes, usage and a summary", () => {
    const { text, state } = replay(recorded.observations, PLAIN);
    const final = recorded.observations.at(-1)!;
    const summary = renderSummary(state, final, { durationMs: 4200 }, PLAIN);
    expect(text + summary).toBe(
      [
        "● running",
        "plan",
        "  ✓ Read the failing test",
        "  ▸ Fix add()",
        "  ○ Run the tests",
        "Looking at the test first.",
        "  ○ Read src/math.js · read",
        "  ✓ Read src/math.js · read",
        "  ◐ Edit src/math.js · edit",
        "  ✎ src/math.js",
        "  ✓ Edit src/math.js · edit",
        "  ✗ Run npm test · execute",
        "  usage: 1,234 / 200,000 tokens · 0.0123 USD",
        "Fixed add().",
        "✔ completed · stop reason end_turn · 4.2s · wc_agent_run_abcdefghijklmnopqrstuvwxyz",
        "  The agent completed the turn.",
        "",
      ].join("\n"),
    );
  });

  it("uses colour only when asked, and the same text underneath", () => {
    const plain = replay(recorded.observations, PLAIN).text;
    const coloured = replay(recorded.observations, { mode: "text", color: true }).text;
    expect(plain).not.toContain("\u001b[");
    expect(coloured).toContain("\u001b[");
    expect(stripAnsi(coloured)).toBe(plain);
  });

  it("renders the same events once even when observations repeat them", () => {
    const twice = [...recorded.observations.slice(0, 2), ...recorded.observations.slice(0, 3)];
    expect(replay(twice, PLAIN).text).toBe(replay(recorded.observations, PLAIN).text);
  });

  it("prints exactly the same output whatever the observation boundaries were", () => {
    const events = recorded.observations.flatMap((o) => o.events);
    const oneByOne = events.map((event, i) =>
      obs({ state: i === events.length - 1 ? "completed" : "running", events: [event] }),
    );
    expect(replay(oneByOne, PLAIN).text).toBe(replay(recorded.observations, PLAIN).text);
  });
});

describe("ndjson rendering", () => {
  it("prints one JSON object per line: state changes and every event with the run id, the terminal state last", () => {
    const recorded = loadRecorded("tools-run");
    // The last observation carries both the terminal state and the run's last three events.
    expect(recorded.observations.at(-1)?.state).toBe("completed");
    expect(recorded.observations.at(-1)?.events).toHaveLength(3);
    const { text } = replay(recorded.observations, JSON_STYLE);
    const lines = text.trimEnd().split("\n");
    const parsed = lines.map(
      (line) => JSON.parse(line) as { type: string; kind?: string; seq?: number; run_id: string; state?: string },
    );
    expect(parsed.map((p) => p.type)).toEqual(["state", ...Array(12).fill("event"), "state"]);
    expect(parsed.at(-2)).toMatchObject({ type: "event", kind: "terminal", seq: 12 });
    expect(parsed.at(-1)).toMatchObject({ type: "state", state: "completed" });
    expect(parsed.filter((p) => p.type === "event").map((p) => p.seq)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    expect(parsed.every((p) => p.run_id === recorded.start.run_id)).toBe(true);
  });

  it("ends with a summary object carrying the exit code", () => {
    const final = obs({
      state: "lost",
      execution_state: "outcome_unknown",
      failure_kind: "transport_lost",
      recovery_kind: "reconcile",
    });
    const line = JSON.parse(renderSummary(initialRenderState(), final, {}, JSON_STYLE)) as Record<string, unknown>;
    expect(line).toMatchObject({
      type: "summary",
      state: "lost",
      failure_kind: "transport_lost",
      exit_code: 3,
      duration_ms: null,
    });
  });

  it("leaves the observation token out of the started line and keeps the key", () => {
    const recorded = loadRecorded("tools-run");
    const text = renderStarted(
      recorded.start,
      { project: "demo", provider: "fake", key: "k1", keyGenerated: true },
      JSON_STYLE,
    );
    const line = JSON.parse(text) as Record<string, unknown>;
    expect(line).toMatchObject({
      type: "started",
      run_id: recorded.start.run_id,
      idempotency_key: "k1",
      project_id: "demo",
    });
    expect(line).not.toHaveProperty("observation_token");
  });
});

describe("text details", () => {
  it("ends a streamed message before the next line and before the summary", () => {
    const first = renderObservation(
      initialRenderState(),
      obs({
        state: "running",
        events: [{ seq: 1, at: "a", kind: "agent_message", text: "no newline", truncated: false }],
      }),
      PLAIN,
    );
    expect(first.text).toBe("● running\nno newline");
    const summary = renderSummary(first.state, obs({ state: "cancelled", stop_reason: "cancelled" }), {}, PLAIN);
    expect(summary.startsWith("\n⊘ cancelled · stop reason cancelled · prompt dispatched")).toBe(true);
  });

  it("shows reasoning apart from the answer", () => {
    const { text } = replay(
      [
        obs({
          state: "running",
          events: [
            { seq: 1, at: "a", kind: "reasoning", text: "pondering", truncated: false },
            { seq: 2, at: "a", kind: "agent_message", text: "Answer.", truncated: true },
          ],
        }),
      ],
      PLAIN,
    );
    expect(text).toBe("● running\nthinking: pondering\nAnswer. […]");
  });

  it("shows a mode change and a config change on one line each, the title and a command count dimmed", () => {
    const none = { mode_id: undefined, config_options: undefined, commands: undefined, title: undefined };
    const { text } = replay(
      [
        obs({
          state: "running",
          events: [
            { ...none, seq: 1, at: "a", kind: "agent_state", change: "mode", mode_id: "plan", truncated: false },
            {
              ...none,
              seq: 2,
              at: "a",
              kind: "agent_state",
              change: "config_options",
              config_options: [
                { id: "mode", value: "acceptEdits" },
                { id: "fast", value: false },
              ],
              truncated: true,
            },
            {
              ...none,
              seq: 3,
              at: "a",
              kind: "agent_state",
              change: "commands",
              commands: ["review", "init"],
              truncated: false,
            },
            {
              ...none,
              seq: 4,
              at: "a",
              kind: "agent_state",
              change: "session_info",
              title: "Fix\nadd()",
              truncated: false,
            },
          ],
        }),
      ],
      PLAIN,
    );
    expect(text).toBe(
      "● running\n  ⚙ mode → plan\n  ⚙ config: mode=acceptEdits · fast=false …\n  · 2 agent commands available\n  · session: Fix add()\n",
    );
    const json = replay(
      [
        obs({
          state: "running",
          events: [
            { ...none, seq: 1, at: "a", kind: "agent_state", change: "mode", mode_id: "plan", truncated: false },
          ],
        }),
      ],
      JSON_STYLE,
    ).text;
    expect(JSON.parse(json.trim().split("\n").at(-1) ?? "")).toMatchObject({
      type: "event",
      kind: "agent_state",
      mode_id: "plan",
    });
  });

  it("explains a permission request and that WebCodex never grants it", () => {
    const { text } = replay(
      [
        obs({
          state: "waiting_permission",
          events: [
            {
              seq: 1,
              at: "a",
              kind: "permission_request",
              tool_call_id: "c",
              title: "Run rm -rf build",
              options: [
                { option_id: "a", name: "Allow once", kind: "allow_once" },
                { option_id: "r", name: "Reject", kind: "reject_once" },
              ],
            },
          ],
        }),
      ],
      PLAIN,
    );
    expect(text).toContain(
      "● waiting for permission\n  ? permission requested: Run rm -rf build\n    options offered: Allow once, Reject\n",
    );
    expect(text).toContain("never grants");
  });

  it("says when history was lost and when the Runner is offline or back", () => {
    const { text } = replay(
      [
        obs({ state: "running", runner_offline: true }),
        obs({ state: "lost", history_lost: true, runner_offline: false, execution_state: "outcome_unknown" }),
      ],
      PLAIN,
    );
    expect(text).toContain("⚠ the run's Runner is offline");
    expect(text).toContain("earlier events of this run are no longer available");
    expect(text).toContain("the Runner is back online");
  });

  it("keeps unknown event kinds as one generic line instead of failing", () => {
    const { text } = replay(
      [obs({ state: "running", events: [{ seq: 1, at: "a", kind: "other", original_kind: "mode_change" }] })],
      PLAIN,
    );
    expect(text).toBe("● running\n  · mode_change\n");
  });

  it.each<[RunState, string, string | undefined]>([
    ["completed", "completed", undefined],
    ["failed", "not_started", "Nothing ran. Fix the cause"],
    ["failed", "started", "Review the project's working tree"],
    ["cancelled", "not_started", undefined],
    ["cancelled", "started", "Changes it already made stay"],
    ["lost", "outcome_unknown", "do not simply start it again"],
    ["running", "started", "webcodex observe wc_agent_run_x --follow"],
  ])("advises what to do when a run is %s (%s)", (state, execution_state, advice) => {
    const text = adviceFor({ run_id: "wc_agent_run_x", state, execution_state, recovery_kind: "none" });
    if (advice === undefined) expect(text).toBeUndefined();
    else expect(text).toContain(advice);
  });

  it("has a label for every state", () => {
    for (const state of RUN_STATES) {
      expect(renderSummary(initialRenderState(), obs({ state }), {}, PLAIN)).toContain(
        state === "waiting_permission" ? "waiting for permission" : state,
      );
    }
  });

  it("formats durations for people", () => {
    expect(formatDuration(4200)).toBe("4.2s");
    expect(formatDuration(125_000)).toBe("2m 05s");
    expect(formatDuration(3_725_000)).toBe("1h 02m");
  });

  it("lists projects with their Runner state and providers", () => {
    const text = renderProjects(
      [
        {
          project_id: "demo",
          runner_online: true,
          allow_patch: true,
          providers: [{ provider_id: "fake", name: "Fake agent", allowed_config_options: ["mode"] }],
        },
        { project_id: "docs", runner_online: false, allow_patch: undefined, providers: [] },
        {
          project_id: "shared",
          runner_online: true,
          allow_patch: true,
          agents_share_runner_user: true,
          providers: [],
        },
      ],
      "http://127.0.0.1:7420/mcp",
      PLAIN,
    );
    expect(text).toContain("3 projects visible to this token");
    expect(text).toContain("demo  runner online · runs allowed\n  fake         Fake agent  config: mode\n");
    expect(text).toContain(
      "shared  runner online · runs allowed · agents run as the Runner's user (agents_share_runner_user)\n",
    );
    expect(text).toContain("docs  runner offline\n  providers appear when the Runner connects\n");
  });
});
