/** The closing line's usage (issue 44 item 3): context tokens and cost, compact; absent parts left out. */
import { describe, expect, it } from "vitest";
import { initialRenderState } from "../src/render.js";
import { compactCount, formatRunUsage, renderSummary } from "../src/render-summary.js";
import { JSON_STYLE, PLAIN } from "../src/style.js";
import { Observation } from "../src/wire.js";

const final = (usage: unknown) =>
  Observation.parse({
    run_id: "wc_agent_run_x",
    state: "completed",
    execution_state: "completed",
    stop_reason: "end_turn",
    recovery_kind: "none",
    observation_token: "t",
    ...(usage !== undefined ? { usage } : {}),
  });

describe("run usage on the closing line", () => {
  it("compacts token counts", () => {
    expect([950, 1234, 12_345, 200_000, 1_500_000].map(compactCount)).toEqual(["950", "1.2k", "12.3k", "200k", "1.5M"]);
  });

  it("shows context used/size and the cost on the summary line", () => {
    const obs = final({ used_tokens: 12_345, context_size: 200_000, cost_amount: 0.0042, cost_currency: "USD" });
    const line = renderSummary(initialRenderState(), obs, { durationMs: 4200 }, PLAIN).split("\n")[0];
    expect(line).toBe("✔ completed · stop reason end_turn · 4.2s · context 12.3k/200k · $0.0042 · wc_agent_run_x");
  });

  it("leaves out what the agent did not report, and names a non-USD currency", () => {
    expect(formatRunUsage({ used_tokens: 10, context_size: null, cost_amount: 2.5, cost_currency: "EUR" })).toBe(
      "context 10 · 2.50 EUR",
    );
    expect(
      formatRunUsage({
        used_tokens: null,
        context_size: null,
        cost_amount: null,
        cost_currency: null,
      }),
    ).toBe("");
    const line = renderSummary(initialRenderState(), final(undefined), {}, PLAIN).split("\n")[0];
    expect(line).toBe("✔ completed · stop reason end_turn · wc_agent_run_x");
  });

  it("carries the usage object in the JSON summary (null without one)", () => {
    const usage = { used_tokens: 1234, context_size: 200_000, cost_amount: 0.0042, cost_currency: "USD" };
    expect(JSON.parse(renderSummary(initialRenderState(), final(usage), {}, JSON_STYLE)).usage).toEqual(usage);
    expect(JSON.parse(renderSummary(initialRenderState(), final(undefined), {}, JSON_STYLE)).usage).toBeNull();
  });
});
