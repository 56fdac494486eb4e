/**
 * The run view's model (src/app/view/model.ts): what the page shows, folded from observe results, before
 * any DOM. The browser test (run-view-browser.test.ts) shows it end to end; this pins the rules a person
 * relies on that the fake agent's scenarios do not reach: a lost run is neither success nor failure, an
 * absolute or escaping path is never shown, controls become visible, and repeated events count once.
 */
import { describe, expect, it } from "vitest";
import {
  adviceFor,
  applyObservation,
  emptyModel,
  OUTSIDE_PROJECT,
  STATE_LABEL,
  shownPath,
  visibleControls,
} from "../../src/app/view/model.js";

const at = "2026-12-01T10:00:00.000Z";

describe("run view model", () => {
  it("shows lost as 'unknown whether it ran', with advice to inspect rather than retry", () => {
    const m = emptyModel();
    applyObservation(
      m,
      { run_id: "r", state: "lost", execution_state: "outcome_unknown", recovery_kind: "inspect", events: [] },
      0,
    );
    expect(STATE_LABEL[m.state ?? "running"]).toBe("Unknown whether it ran");
    expect(adviceFor(m)).toMatch(/may have run.*do not simply start it again/);
  });

  it("never shows an absolute, home-relative or escaping path", () => {
    for (const p of [
      "/etc/passwd",
      "C:\\Users\\x",
      "~/.ssh/id_ed25519",
      "../outside.txt",
      "a/../../b",
      "\\\\host\\share",
    ])
      expect(shownPath(p), p).toBe(OUTSIDE_PROJECT);
    expect(shownPath("src/math.js")).toBe("src/math.js");
  });

  it("makes terminal and bidi controls visible, keeping newlines and tabs", () => {
    expect(visibleControls("a\u001b[2Jb\u202ec\n\td\u009b")).toBe("a\\x1b[2Jb\\u202ec\n\td\\x9b");
  });

  it("folds events once each, in order: a repeated page does not duplicate messages, steps or files", () => {
    const m = emptyModel();
    const events = [
      { seq: 1, at, kind: "agent_message", text: "Hel", truncated: false },
      { seq: 2, at, kind: "agent_message", text: "lo", truncated: false },
      { seq: 3, at, kind: "tool_activity", tool_call_id: "t1", title: "Edit", tool_kind: "edit", status: "pending" },
      { seq: 4, at, kind: "file_change", tool_call_id: "t1", path: "src/a.js" },
      { seq: 5, at, kind: "tool_activity", tool_call_id: "t1", title: "Edit", tool_kind: "edit", status: "failed" },
      { seq: 6, at, kind: "agent_message", text: "after", truncated: false },
    ];
    const obs = { run_id: "r", state: "running", execution_state: "started", recovery_kind: "wait", events };
    applyObservation(m, obs, 0);
    applyObservation(m, obs, 0);
    expect(m.messages).toEqual(["Hello", "after"]);
    expect(m.steps).toEqual([{ id: "t1", title: "Edit", kind: "edit", status: "failed" }]);
    expect(m.files).toEqual(["src/a.js"]);
    expect(m.startedAt).toBe(Date.parse(at));
  });
});

describe("run view model: usage", () => {
  it("shows the observation's usage even when the run's usage events are gone (history lost)", () => {
    const m = emptyModel();
    const usage = { used_tokens: 1234, context_size: 200000, cost_amount: 0.0042, cost_currency: "USD" };
    applyObservation(
      m,
      { run_id: "r", state: "completed", execution_state: "completed", history_lost: true, events: [], usage },
      0,
    );
    expect(m.usage).toEqual({ usedTokens: 1234, contextSize: 200000, costAmount: 0.0042, costCurrency: "USD" });
    // A later observation without usage keeps what was shown.
    applyObservation(m, { run_id: "r", state: "completed", execution_state: "completed", events: [] }, 0);
    expect(m.usage?.usedTokens).toBe(1234);
  });
});
