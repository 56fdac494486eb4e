/**
 * Observation streams recorded from a real Server + Runner + fake agent
 * (scripts/demo.mjs; see fixtures/real-*.json), replayed through the renderer.
 */
import { describe, expect, it } from "vitest";
import { initialRenderState, renderObservation } from "../src/render.js";
import { durationFromEvents, renderSummary } from "../src/render-summary.js";
import { JSON_STYLE, PLAIN, type Style } from "../src/style.js";
import { loadRecorded, type Recorded } from "./support.js";

function render(recorded: Recorded, style: Style): string {
  let state = initialRenderState();
  let text = "";
  for (const obs of recorded.observations) {
    const out = renderObservation(state, obs, style);
    state = out.state;
    text += out.text;
  }
  return text + renderSummary(state, recorded.observations.at(-1)!, {}, style);
}

describe("recorded real streams", () => {
  it("tools: plan, tool steps, both file changes (one masked), terminal, reasoning, message, usage", () => {
    const recorded = loadRecorded("real-tools");
    expect(render(recorded, PLAIN)).toBe(
      [
        "● running",
        "plan",
        "  ✓ Read src/math.js",
        "  ▸ Fix add()",
        "  ○ Run the tests",
        "  ○ Edit src/math.js · edit",
        "  ◐ Edit src/math.js · edit",
        "  ✓ Edit src/math.js · edit",
        "  ✎ src/math.js",
        "  ✎ (a file outside the project root; the Runner withholds its path)",
        "  ◐ npm test · execute",
        "  ▸ terminal term-1",
        "  ✓ npm test · execute",
        "thinking: The subtraction was a typo; the tests pass now.",
        "I fixed add() in src/math.js and the tests pass.",
        "  usage: 1,234 / 200,000 tokens · 0.0042 USD",
        `✔ completed · stop reason end_turn · ${recorded.start.run_id}`,
        "  The agent completed the turn.",
        "",
      ].join("\n"),
    );
  });

  it("cancelled: streamed ticks, then the correlated cancel", () => {
    const recorded = loadRecorded("real-cancelled");
    const text = render(recorded, PLAIN);
    expect(text).toMatch(/^● running\ntick 0\ntick 1\n/);
    expect(text).toContain(`⊘ cancelled · stop reason cancelled · turn ended · ${recorded.start.run_id}\n`);
    expect(text).toContain("The agent stopped. Changes it already made stay");
  });

  it("failed before dispatch: no state line, the fixed message, and what to do", () => {
    const recorded = loadRecorded("real-failed-config");
    const text = render(recorded, PLAIN);
    expect(text.startsWith(`✖ failed · invalid_config · prompt not dispatched · ${recorded.start.run_id}\n`)).toBe(
      true,
    );
    expect(text).toContain("Stage: set_config_option. No prompt was dispatched.");
    expect(text).toContain("Nothing ran. Fix the cause and start a new run.");
  });

  it.each(["real-tools", "real-cancelled", "real-failed-config"])(
    "%s as ndjson: every event once, in seq order from 1, then a summary",
    (name) => {
      const recorded = loadRecorded(name);
      const lines = render(recorded, JSON_STYLE)
        .trimEnd()
        .split("\n")
        .map((l) => JSON.parse(l) as { type: string; seq?: number; kind?: string });
      const seqs = lines.filter((l) => l.type === "event").map((l) => l.seq);
      expect(seqs).toEqual(seqs.map((_, i) => i + 1));
      expect(lines.filter((l) => l.kind === "terminal")).toHaveLength(1);
      expect(lines.at(-1)?.type).toBe("summary");
    },
  );

  it("derives a finished run's duration from its own events", () => {
    const events = loadRecorded("real-tools").observations.flatMap((o) => o.events);
    // The recording's seq 1 is at 22:01:27.929Z and its terminal event at 22:01:27.973Z.
    expect(durationFromEvents(events)).toBe(44);
    // Without its terminal event the run has no duration yet.
    expect(durationFromEvents(events.filter((e) => e.kind !== "terminal"))).toBeUndefined();
  });
});
