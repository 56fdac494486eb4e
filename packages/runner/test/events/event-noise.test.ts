/**
 * Issue 12 §7 and issue 20 §3: ACP v1's session-state updates become bounded
 * `agent_state` events, and event noise is folded without losing information —
 * replayed from stored update sequences of real adapters
 * (fake-acp-agent/fixtures/updates/*.json: edit turns reconstructed from the
 * adapters' code, and offline sequences recorded from the installed adapters
 * — each fixture's `source` says which), through the normalizer alone and
 * through a real run of the fake agent.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { RequestPermissionRequest, SessionUpdate } from "@agentclientprotocol/sdk";
import { MAX_AGENT_STATE_ITEMS, RunEvent, type RunEventBody } from "@webcodex/protocol";
import { afterAll, describe, expect, test } from "vitest";
import { REPO_ROOT, readLedger } from "../../../../scripts/test-support/index.js";
import { PENDING_TOOL_HOLD_MS } from "../../src/events/coalescer.js";
import { EventNormalizer } from "../../src/events/normalize.js";
import { Redactor } from "../../src/events/redactor.js";
import { makeWorkspace, newManager, runToEnd, writeConfig } from "../support/harness.js";

const ROOT = "/work/p";
type Step = { update: SessionUpdate } | { permission: Omit<RequestPermissionRequest, "sessionId"> };

function fixture(name: string): Step[] {
  const file = join(REPO_ROOT, "fake-acp-agent/fixtures/updates", `${name}.json`);
  return JSON.parse(readFileSync(file, "utf8").replaceAll("<cwd>", ROOT)).steps as Step[];
}

/** A normalizer over a fake clock; `delays` records what it asked its owner for. */
function harness() {
  const out: RunEventBody[] = [];
  const delays: number[] = [];
  let clock = 0;
  const n = new EventNormalizer({
    projectRoot: ROOT,
    redactor: new Redactor(["sk-ant-secret-key"], ROOT),
    emit: (b) => out.push(b),
    onPending: (d) => delays.push(d),
    now: () => clock,
  });
  const feed = (step: Step) => {
    if ("update" in step) n.handle(step.update);
    else n.permissionRequest({ ...step.permission, sessionId: "s" });
  };
  return { n, out, delays, feed, tick: (ms: number) => (clock += ms) };
}

const tool = (id: string, title: string, kind: string, status: string) => ({
  kind: "tool_activity",
  tool_call_id: id,
  title,
  tool_kind: kind,
  status,
});
const usage = (used: number, cost: number | null = null) => ({
  kind: "usage",
  used_tokens: used,
  context_size: 200000,
  cost_amount: cost,
  cost_currency: cost === null ? null : "USD",
});

describe("recorded real sequences", () => {
  test("a Claude edit turn: pending re-announcements become one event with the refined title, consecutive usage in one window keeps the latest, empty chunks vanish", () => {
    const { n, out, feed } = harness();
    const steps = fixture("claude-edit-turn");
    for (const step of steps) feed(step);
    n.flush();
    for (const body of out) RunEvent.parse({ ...body, seq: 1, at: "x" });
    expect(out).toEqual([
      { kind: "agent_state", change: "commands", commands: ["compact", "init", "review"], truncated: false },
      usage(15210),
      { kind: "reasoning", text: "The test fails because add() subtracts.", truncated: false },
      { kind: "agent_message", text: "I'll look at src/math.js first.", truncated: false },
      usage(15388),
      tool("toolu_01Read", "Read src/math.js", "read", "pending"),
      usage(15502, 0.0121),
      tool("toolu_01Read", "Read src/math.js", "read", "completed"),
      tool("toolu_02Edit", "Edit `src/math.js`", "edit", "pending"),
      { kind: "file_change", tool_call_id: "toolu_02Edit", path: "src/math.js" },
      usage(15840),
      { kind: "file_change", tool_call_id: "toolu_02Edit", path: "src/math.js" },
      tool("toolu_02Edit", "Edit `src/math.js`", "edit", "completed"),
      { kind: "agent_message", text: "Fixed: add() now adds.", truncated: false },
      usage(16012, 0.0187),
      { kind: "agent_state", change: "session_info", title: "Fix add() in src/math.js", truncated: false },
    ]);
    expect(steps.length).toBe(22);
    expect(n.ignoredUpdates).toBe(0);
  });

  test("each update in its own flush window: tool refinements still fold (pending hold), usage is kept per window, order is unchanged", () => {
    const { n, out, feed, tick } = harness();
    for (const step of fixture("claude-edit-turn")) {
      feed(step);
      tick(20);
      n.flushStreamed();
    }
    n.flush();
    const tools = out.filter((b) => b.kind === "tool_activity");
    expect(tools).toEqual([
      tool("toolu_01Read", "Read src/math.js", "read", "pending"),
      tool("toolu_01Read", "Read src/math.js", "read", "completed"),
      tool("toolu_02Edit", "Edit `src/math.js`", "edit", "pending"),
      tool("toolu_02Edit", "Edit `src/math.js`", "edit", "completed"),
    ]);
    // Every usage snapshot is its own window here: none is folded away.
    expect(out.filter((b) => b.kind === "usage").map((b) => (b as { used_tokens: number }).used_tokens)).toEqual([
      15210, 15388, 15501, 15502, 15840, 16012, 16012,
    ]);
    const kinds = out.map((b) => b.kind);
    expect(kinds.indexOf("reasoning")).toBeLessThan(kinds.indexOf("agent_message"));
    expect(kinds.at(-1)).toBe("agent_state");
  });

  test("Gemini: [MODE_UPDATE] becomes a mode change, and a permission request for an unannounced tool yields its tool_activity first", () => {
    const { n, out, feed } = harness();
    for (const step of fixture("gemini-edit-turn")) feed(step);
    n.flush();
    for (const body of out) RunEvent.parse({ ...body, seq: 1, at: "x" });
    const id = "run_shell_command-1764504000000";
    expect(out).toEqual([
      { kind: "agent_state", change: "mode", mode_id: "autoEdit", truncated: false },
      { kind: "reasoning", text: "**Fixing the addition**", truncated: false },
      { kind: "agent_message", text: "I will fix the add function.", truncated: false },
      tool(id, "npm test", "execute", "pending"),
      {
        kind: "permission_request",
        tool_call_id: id,
        title: "npm test",
        options: [
          { option_id: "proceed_once", name: "Allow", kind: "allow_once" },
          { option_id: "proceed_always", name: "Allow always", kind: "allow_always" },
          { option_id: "cancel", name: "Reject", kind: "reject_once" },
        ],
      },
      tool(id, "npm test", "execute", "failed"),
      { kind: "agent_message", text: "The command was not approved.", truncated: false },
    ]);
    expect(JSON.stringify(out)).not.toContain("MODE_UPDATE");
  });

  test("Codex: a command re-announced in_progress while its output streams is one event; the last two usage updates are one", () => {
    const { n, out, feed } = harness();
    for (const step of fixture("codex-exec-turn")) feed(step);
    n.flush();
    expect(out).toEqual([
      { ...usage(9120), context_size: 272000 },
      tool("call_exec_1", "Run npm test", "execute", "in_progress"),
      tool("call_exec_1", "Run npm test", "execute", "completed"),
      { ...usage(9533), context_size: 272000 },
      { kind: "agent_message", text: "All tests pass.", truncated: false },
    ]);
  });
});

describe("sequences recorded from the real adapters (scripts/record-updates.mjs, offline)", () => {
  test("claude-agent-acp without credentials: two command lists and the forced mode become agent_state events, nothing is ignored", () => {
    const { n, out, feed } = harness();
    for (const step of fixture("claude-no-credentials")) feed(step);
    n.flush();
    for (const body of out) RunEvent.parse({ ...body, seq: 1, at: "x" });
    expect(out.map((b) => (b.kind === "agent_state" ? b.change : b.kind))).toEqual(["commands", "mode", "commands"]);
    expect(out[0]).toMatchObject({ truncated: false });
    expect((out[0] as { commands: string[] }).commands).toHaveLength(44);
    expect(out[1]).toMatchObject({ mode_id: "acceptEdits" });
    expect((out[2] as { commands: string[] }).commands).toHaveLength(40);
    expect(n.ignoredUpdates).toBe(0);
  });

  test("codex-acp offline: its title-less session_info_updates (reconnect notices in _meta) are only counted", () => {
    const { n, out, feed } = harness();
    for (const step of fixture("codex-offline")) feed(step);
    n.flush();
    expect(out.map((b) => b.kind)).toEqual(["agent_state", "agent_message"]);
    expect((out[0] as { commands: string[] }).commands).toContain("review");
    expect(n.ignoredUpdates).toBe(7);
    expect(JSON.stringify(out)).not.toContain("Reconnecting");
  });
});

describe("coalescing rules", () => {
  test("a pending tool call is held at most PENDING_TOOL_HOLD_MS for a refinement, then emitted", () => {
    const { n, out, delays, tick } = harness();
    n.handle({ sessionUpdate: "tool_call", toolCallId: "t1", title: "Edit", kind: "edit", status: "pending" });
    expect(delays).toEqual([PENDING_TOOL_HOLD_MS]);
    tick(PENDING_TOOL_HOLD_MS / 2);
    n.flushStreamed(); // an early flush window (text pacer): still held, and asks again for the rest
    expect(out).toEqual([]);
    expect(delays.at(-1)).toBe(PENDING_TOOL_HOLD_MS / 2);
    tick(PENDING_TOOL_HOLD_MS / 2);
    n.flushStreamed();
    expect(out).toEqual([tool("t1", "Edit", "edit", "pending")]);
    // A later refinement (new title, same status) is new information: it is emitted, not dropped.
    n.handle({ sessionUpdate: "tool_call_update", toolCallId: "t1", title: "Edit src/a.js" });
    n.flush();
    expect(out).toEqual([tool("t1", "Edit", "edit", "pending"), tool("t1", "Edit src/a.js", "edit", "pending")]);
  });

  test("a status change is never folded, and another kind of event releases what is held first", () => {
    const { n, out } = harness();
    n.handle({
      sessionUpdate: "tool_call",
      toolCallId: "t1",
      title: "npm test",
      kind: "execute",
      status: "in_progress",
    });
    n.handle({ sessionUpdate: "usage_update", used: 1, size: 10 });
    n.handle({ sessionUpdate: "tool_call_update", toolCallId: "t1", status: "completed" });
    n.handle({ sessionUpdate: "usage_update", used: 2, size: 10 });
    n.handle({ sessionUpdate: "usage_update", used: 3, size: 10 });
    n.handle({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: "done" } });
    n.flush();
    expect(
      out.map((b) => [
        b.kind,
        (b as { status?: string; used_tokens?: number }).status ?? (b as { used_tokens?: number }).used_tokens ?? null,
      ]),
    ).toEqual([
      ["tool_activity", "in_progress"],
      ["usage", 1],
      ["tool_activity", "completed"],
      ["usage", 3],
      ["agent_message", null],
    ]);
  });
});

describe("agent_state", () => {
  test("each ACP session-state update becomes a bounded agent_state snapshot; an unchanged one is dropped", () => {
    const { n, out } = harness();
    const options = [
      {
        type: "select" as const,
        id: "mode",
        name: "Mode",
        currentValue: "acceptEdits",
        options: [{ value: "acceptEdits", name: "Accept edits" }],
      },
      { type: "boolean" as const, id: "fast", name: "Fast", currentValue: false },
    ];
    n.handle({ sessionUpdate: "current_mode_update", currentModeId: "plan" });
    n.flush();
    n.handle({ sessionUpdate: "config_option_update", configOptions: options });
    n.flush();
    n.handle({ sessionUpdate: "config_option_update", configOptions: options });
    n.flush();
    n.handle({
      sessionUpdate: "available_commands_update",
      availableCommands: Array.from({ length: MAX_AGENT_STATE_ITEMS + 5 }, (_, i) => ({
        name: `cmd${i}`,
        description: "a long description that is never forwarded",
      })),
    });
    n.handle({ sessionUpdate: "session_info_update", title: "Use sk-ant-secret-key in /work/p/src" });
    n.handle({ sessionUpdate: "session_info_update", updatedAt: "2026-01-01T00:00:00Z" });
    n.flush();
    for (const body of out) RunEvent.parse({ ...body, seq: 1, at: "x" });
    expect(out[0]).toEqual({ kind: "agent_state", change: "mode", mode_id: "plan", truncated: false });
    expect(out[1]).toEqual({
      kind: "agent_state",
      change: "config_options",
      config_options: [
        { id: "mode", value: "acceptEdits" },
        { id: "fast", value: false },
      ],
      truncated: false,
    });
    expect(out[2]).toMatchObject({ change: "commands", truncated: true });
    expect((out[2] as { commands: string[] }).commands).toHaveLength(MAX_AGENT_STATE_ITEMS);
    expect(JSON.stringify(out[2])).not.toContain("description");
    expect(out[3]).toEqual({
      kind: "agent_state",
      change: "session_info",
      title: "Use [redacted] in src",
      truncated: false,
    });
    expect(out).toHaveLength(4);
    expect(n.ignoredUpdates).toBe(1); // the updatedAt-only session_info_update
  });
});

describe("through a real run of the fake agent", () => {
  const ws = makeWorkspace();
  const config = writeConfig(ws, {
    acp: { permission_timeout_secs: 1 },
    agents: [{ id: "fake", args: ["--ledger", ws.ledger, "--config-options", "mode"] }],
  });
  const { manager } = newManager(config);
  afterAll(async () => {
    await manager.close();
    ws.cleanup();
  });

  test("scenario agent_state: mode, config, commands and title reach the ring as agent_state events, the repeated snapshot once", async () => {
    const { run, events } = await runToEnd(manager, "scenario: agent_state");
    expect(run.state).toBe("completed");
    const states = events.filter((e) => e.kind === "agent_state");
    expect(states.map((e) => e.change)).toEqual(["mode", "config_options", "commands", "session_info", "mode"]);
    expect(states[0]).toMatchObject({ mode_id: "code" });
    expect(states[1]).toMatchObject({ config_options: [{ id: "mode", value: "ask" }] });
    expect(states[2]).toMatchObject({ commands: ["review", "compact"] });
    expect(states[3]).toMatchObject({ title: "Fix add() in src/math.js" });
    expect(states[4]).toMatchObject({ mode_id: "autoEdit" });
    expect(events.some((e) => e.kind === "agent_message" && e.text.includes("MODE_UPDATE"))).toBe(false);
    expect(run.ignored_updates).toBe(0);
  });

  test("a replayed Gemini turn: the unannounced tool shows before its permission request, which is never allowed", async () => {
    const { run, events } = await runToEnd(manager, "scenario: replay fixture=gemini-edit-turn");
    expect(run.state).toBe("completed");
    const i = events.findIndex((e) => e.kind === "permission_request");
    expect(i).toBeGreaterThan(0);
    expect(events[i - 1]).toMatchObject({ kind: "tool_activity", title: "npm test", status: "pending" });
    expect(
      readLedger(ws.ledger)
        .filter((e) => e.event === "permission_outcome")
        .at(-1),
    ).toMatchObject({
      outcome: "cancelled",
    });
  });
});
