import type { RunEvent, RunSummary } from "@webcodex/protocol";
import { describe, expect, it, vi } from "vitest";
import { MirrorSet, RunMirror } from "../../src/runs/mirror.js";

const RUN = "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa";
function summary(last: number, oldest = 1, state: RunSummary["state"] = "running"): RunSummary {
  return {
    run_id: RUN,
    intent_fingerprint: "0".repeat(64),
    project_id: "demo",
    provider_id: "fake",
    provider_instance_id: "p".repeat(16),
    agent_instance_id: "a".repeat(16),
    phase: "dispatch_barrier",
    state,
    execution_state: "started",
    stop_reason: null,
    failure_kind: null,
    recovery_kind: "wait",
    message: null,
    effective_config: [],
    ignored_updates: 0,
    last_seq: last,
    oldest_seq: oldest,
    created_at: "t",
    updated_at: "t",
  };
}
function ev(seq: number): RunEvent {
  return { seq, at: "t", kind: "agent_message", text: `m${seq}`, truncated: false };
}

describe("run mirror", () => {
  it("appends contiguous events and reports a gap by seq", () => {
    const m = new RunMirror(RUN);
    m.reset("a".repeat(16));
    m.markSynced(summary(0));
    expect(m.applyUpdate(summary(2), [ev(1), ev(2)])).toBe(false);
    expect(m.applyUpdate(summary(5), [ev(4), ev(5)])).toBe(true);
    expect(m.lastSeq).toBe(2);
    expect(m.applySync(2, summary(5), [ev(3), ev(4), ev(5)], false)).toBe(false);
    expect(m.eventsAfter(0).map((e) => e.seq)).toEqual([1, 2, 3, 4, 5]);
    expect(m.eventsAfter(3).map((e) => e.seq)).toEqual([4, 5]);
  });

  it("reports each held event's serialized size as measured when it was appended", () => {
    const m = new RunMirror(RUN);
    m.reset("a".repeat(16));
    m.markSynced(summary(0));
    m.applyUpdate(summary(3), [
      ev(1),
      ev(2),
      { seq: 3, at: "t", kind: "agent_message", text: "héllo ✓", truncated: false },
    ]);
    for (const e of m.eventsAfter(1)) expect(m.sizeOf(e)).toBe(Buffer.byteLength(JSON.stringify(e), "utf8"));
    expect(m.sizeOf(ev(9))).toBe(Buffer.byteLength(JSON.stringify(ev(9)), "utf8"));
  });

  it("ignores duplicates and treats an unsynced mirror as behind", () => {
    const m = new RunMirror(RUN);
    m.reset("a".repeat(16));
    expect(m.applyUpdate(summary(1), [ev(1)])).toBe(true);
    m.applySync(0, summary(1), [ev(1)], false);
    expect(m.applyUpdate(summary(2), [ev(1), ev(2)])).toBe(false);
    expect(m.eventsAfter(0).map((e) => e.seq)).toEqual([1, 2]);
  });

  it("starts at the Runner's oldest held event when earlier history is gone", () => {
    const m = new RunMirror(RUN);
    m.reset("a".repeat(16));
    m.applySync(0, summary(12, 10), [ev(10), ev(11), ev(12)], false);
    expect(m.firstSeq).toBe(10);
    const r = new RunMirror(RUN);
    r.reset("b".repeat(16));
    r.applySync(0, summary(50, 51, "lost"), [], false);
    expect(r.lastSeq).toBe(50);
    expect(r.firstSeq).toBe(51);
    expect(r.eventsAfter(0)).toEqual([]);
  });

  it("stays bounded by count, advancing its first seq", () => {
    const m = new RunMirror(RUN, 3);
    m.reset("a".repeat(16));
    m.markSynced(summary(0));
    m.applyUpdate(summary(5), [ev(1), ev(2), ev(3), ev(4), ev(5)]);
    expect(m.size).toBe(3);
    expect(m.firstSeq).toBe(3);
  });

  it("wakes waiters on the next change without polling", async () => {
    const m = new RunMirror(RUN);
    m.reset("a".repeat(16));
    m.markSynced(summary(0));
    const v = m.version;
    vi.useFakeTimers();
    try {
      const wait = m.waitForChange(v, 10_000);
      expect(vi.getTimerCount()).toBe(1); // the wait's own bound
      m.applyUpdate(summary(1), [ev(1)]);
      // Woken by the change, with no time passed: its bound's timer is gone.
      expect(vi.getTimerCount()).toBe(0);
      await wait;
    } finally {
      vi.useRealTimers();
    }
    const ac = new AbortController();
    const aborted = m.waitForChange(m.version, 10_000, ac.signal);
    ac.abort();
    await aborted;
  });
});

describe("mirror set bounds", () => {
  const text = (seq: number, s: string): RunEvent => ({
    seq,
    at: "t",
    kind: "agent_message",
    text: s,
    truncated: false,
  });
  function fill(m: RunMirror, events: RunEvent[]): void {
    m.reset("a".repeat(16));
    m.markSynced(summary(0));
    m.applyUpdate(summary(events.length), events);
  }

  it("counts held bytes in UTF-8, not UTF-16 units", () => {
    const m = new RunMirror(RUN);
    const e = text(1, "é".repeat(100));
    fill(m, [e]);
    expect(m.bytes).toBe(Buffer.byteLength(JSON.stringify(e), "utf8"));
    expect(m.bytes).toBeGreaterThan(JSON.stringify(e).length);
  });

  it("evicts the least recently used idle mirrors beyond the count, terminal or not", () => {
    const set = new MirrorSet(2);
    const a = set.getOrCreate("a");
    fill(a, [ev(1)]); // non-terminal
    set.getOrCreate("b");
    set.get("a"); // a is now more recently used than b
    set.getOrCreate("c");
    expect(set.size).toBe(2);
    expect(set.get("b")).toBeUndefined();
    expect(set.get("a")).toBe(a);
  });

  it("keeps mirrors that have waiters or a catch-up in flight", async () => {
    const set = new MirrorSet(1);
    const waited = set.getOrCreate("w");
    const wait = waited.waitForChange(waited.version, 10_000);
    const syncing = set.getOrCreate("s");
    syncing.syncing = new Promise(() => undefined);
    set.getOrCreate("x");
    expect(set.get("w")).toBe(waited);
    expect(set.get("s")).toBe(syncing);
    waited.touch();
    await wait;
    set.getOrCreate("y");
    expect(set.get("w")).toBeUndefined();
    expect(set.get("s")).toBe(syncing);
  });

  it("evicts idle mirrors beyond the global byte budget and stops counting them", () => {
    const set = new MirrorSet(100, 3000);
    const a = set.getOrCreate("a");
    fill(a, [text(1, "x".repeat(1800))]);
    expect(set.totalBytes).toBe(a.bytes);
    const b = set.getOrCreate("b");
    fill(b, [text(1, "y".repeat(1800))]);
    expect(set.get("a")).toBeUndefined();
    expect(set.get("b")).toBe(b);
    expect(set.totalBytes).toBe(b.bytes);
    fill(a, [text(1, "z".repeat(1800))]); // an evicted mirror no longer counts
    expect(set.totalBytes).toBe(b.bytes);
  });
});
