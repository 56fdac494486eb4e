/**
 * The link's hello and run.inventory results always fit one frame, and the
 * RunService admits synchronously — the property the link's hello relies on
 * to never report an about-to-be-admitted run as unknown.
 */
import { MAX_FRAME_BYTES, parseRunnerFrame, type RunSummary } from "@webcodex/protocol";
import { afterEach, describe, expect, it, vi } from "vitest";
import WebSocket from "ws";
import { IN_PROCESS_POLL_MS, IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { FakeRunService } from "../../../server/test/support/fake-run-service.js";
import { alice, Harness } from "../../../server/test/support/in-process.js";
import { fitInventory } from "../../src/link/link.js";
import { makeWorkspace, newManager, startRequest, waitForState, writeConfig } from "../support/harness.js";

const R1 = { id: "r1", token: "token-one-aaaaaaaaaaaaaaaa", projects: ["demo"] };

function summary(i: number, state: RunSummary["state"]): RunSummary {
  const id = `wc_agent_run_${i
    .toString(32)
    .padStart(26, "a")
    .replace(/[01189]/g, "b")}`;
  return {
    run_id: id,
    intent_fingerprint: "f".repeat(64),
    project_id: "demo",
    provider_id: "fake",
    provider_instance_id: "pi_0123456789abcdef",
    agent_instance_id: "ai_0123456789abcdef",
    phase: state === "running" ? "dispatch_barrier" : "terminal",
    state,
    execution_state: state === "running" ? "started" : "completed",
    stop_reason: state === "completed" ? "end_turn" : null,
    failure_kind: null,
    recovery_kind: state === "running" ? "wait" : "none",
    message: "m".repeat(500),
    effective_config: Array.from({ length: 64 }, (_, k) => ({ id: `option_${k}`, value: "v".repeat(40) })),
    ignored_updates: 0,
    last_seq: 3,
    oldest_seq: 1,
    created_at: new Date(2026, 0, 1, 0, 0, i).toISOString(),
    updated_at: new Date(2026, 0, 1, 0, 0, i).toISOString(),
  };
}

describe("fitInventory", () => {
  it("keeps every open run and the newest terminal runs that fit, in input order", () => {
    const runs = [summary(0, "completed"), summary(1, "running"), summary(2, "completed"), summary(3, "running")];
    const one = Buffer.byteLength(JSON.stringify(runs[0])) + 1;
    const fitted = fitInventory(runs, one * 3);
    expect(fitted.map((r) => r.run_id)).toEqual([runs[0], runs[1], runs[3]].map((r) => r!.run_id));
  });
});

describe("hello with a large inventory", () => {
  let h: Harness;
  afterEach(async () => {
    vi.restoreAllMocks();
    await h.close();
  });

  it("fits one frame: the Server accepts it, open runs are all there, oldest terminal runs left out", async () => {
    h = await new Harness().start([R1]);
    // Every text frame any ws socket in this process sends (the link's included), as sent.
    const sent: string[] = [];
    const realSend = WebSocket.prototype.send;
    vi.spyOn(WebSocket.prototype, "send").mockImplementation(function (this: WebSocket, ...args) {
      if (typeof args[0] === "string") sent.push(args[0]);
      return realSend.apply(this, args as Parameters<typeof realSend>);
    });
    const svc = new FakeRunService();
    const open = [summary(5000, "running"), summary(5001, "running")];
    const inventory = [...open, ...Array.from({ length: 1000 }, (_, i) => summary(i, "completed"))];
    // A single hello carrying all of these would be several MiB.
    expect(Buffer.byteLength(JSON.stringify(inventory))).toBeGreaterThan(MAX_FRAME_BYTES);
    svc.inventory = () => inventory;
    const link = h.link(svc, R1.token);
    await poll(() => link.connected, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    expect(h.log.lines.some((l) => l.includes("runner hello accepted"))).toBe(true);
    expect((await h.server.runs.listProjects(alice)).find((p) => p.project_id === "demo")?.runner_online).toBe(true);
    // What the link actually sent: a hello within the frame bound, both open runs, only the newest terminal runs.
    expect(h.log.lines.some((l) => l.includes("inventory larger than one frame"))).toBe(true);
    const hellos = sent
      .filter((text) => text.startsWith('{"type":"hello"'))
      .map((text) => ({ text, parsed: parseRunnerFrame(text) }));
    expect(hellos).toHaveLength(1);
    const hello = hellos[0]!;
    expect(Buffer.byteLength(hello.text)).toBeLessThanOrEqual(MAX_FRAME_BYTES);
    if (!hello.parsed.ok || hello.parsed.frame.type !== "hello") throw new Error("the link sent an invalid hello");
    const runs = hello.parsed.frame.inventory;
    expect(runs.filter((r) => r.state === "running").map((r) => r.run_id)).toEqual(open.map((r) => r.run_id));
    const terminal = runs.filter((r) => r.state === "completed");
    expect(terminal.length).toBeGreaterThan(0);
    expect(terminal.length).toBeLessThan(1000);
    // The ones left out are the last of the service's list (newest first): what was kept is its head.
    const allTerminal = inventory.filter((r) => r.state === "completed").map((r) => r.run_id);
    expect(terminal.map((r) => r.run_id)).toEqual(allTerminal.slice(0, terminal.length));
  });
});

describe("RunService admission is synchronous", () => {
  it("a run is known to sync() and inventory() as soon as start() is called, before it resolves", async () => {
    const ws = makeWorkspace();
    const { manager, store } = newManager(writeConfig(ws));
    try {
      const req = startRequest(manager, "scenario: hello");
      const pending = manager.start(req);
      // No await between the call and these reads: the link's hello may be built right here.
      expect(manager.sync(req.run_id, 0, 10)).not.toBeNull();
      expect(manager.inventory().some((r) => r.run_id === req.run_id)).toBe(true);
      const outcome = await pending;
      expect(outcome.ok).toBe(true);
      await waitForState(manager, req.run_id, "completed");
    } finally {
      await manager.close();
      store.close();
      ws.cleanup();
    }
  });
});
