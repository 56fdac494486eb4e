/** Units: the event ring, normalization (bounds, coalescing, redaction, paths) and config sequencing over a fake `set`. */
import type { SessionConfigOption } from "@agentclientprotocol/sdk";
import {
  MAX_EFFECTIVE_CONFIG_ENTRIES,
  MAX_EVENT_TEXT_BYTES,
  OUTSIDE_PROJECT_PATH,
  RunEvent,
  type RunEventBody,
  utf8Length,
} from "@webcodex/protocol";
import { describe, expect, test } from "vitest";
import { sequenceConfig } from "../../src/acp/config-sequencing.js";
import type { RequestOutcome } from "../../src/acp/session.js";
import { EventNormalizer, relativizePath } from "../../src/events/normalize.js";
import { REDACTED, Redactor } from "../../src/events/redactor.js";
import { EventRing } from "../../src/events/ring.js";

const msg = (text: string): RunEventBody => ({ kind: "agent_message", text, truncated: false });

describe("event ring", () => {
  test("assigns seq from 1, pages with read(after, max), and evicts oldest by count", () => {
    const ring = new EventRing({ maxEvents: 3 });
    for (let i = 0; i < 5; i++) ring.push(msg(`m${i}`));
    expect(ring.lastSeq).toBe(5);
    expect(ring.oldestSeq).toBe(3);
    expect(ring.read(0, 2)).toMatchObject({ events: [{ seq: 3 }, { seq: 4 }], hasMore: true });
    expect(ring.read(4, 10)).toMatchObject({ events: [{ seq: 5 }], hasMore: false });
    expect(ring.read(5, 10).events).toEqual([]);
  });

  test("stamps a copy of the body with seq then at, from the clock's current millisecond", () => {
    let ms = Date.UTC(2026, 10, 30, 18, 0, 0, 5);
    const ring = new EventRing({}, () => new Date(ms));
    const body: RunEventBody = {
      kind: "tool_activity",
      tool_call_id: "t1",
      title: "Read",
      tool_kind: "read",
      status: "pending",
    };
    const first = ring.push(body);
    const second = ring.push(body);
    ms += 1;
    const third = ring.push(msg("later"));
    // Field order is the body's, then seq and at: the serialized event (and its size) is `{ ...body, seq, at }`.
    expect(JSON.stringify(first)).toBe(JSON.stringify({ ...body, seq: 1, at: "2026-11-30T18:00:00.005Z" }));
    expect(second).toMatchObject({ seq: 2, at: "2026-11-30T18:00:00.005Z" });
    expect(third).toMatchObject({ seq: 3, at: "2026-11-30T18:00:00.006Z" });
    expect(first).not.toBe(body);
    expect(body).not.toHaveProperty("seq");
    expect(ring.bytes).toBe([first, second, third].reduce((n, e) => n + Buffer.byteLength(JSON.stringify(e)), 0));
  });

  test("evicts by serialized bytes", () => {
    const ring = new EventRing({ maxBytes: 1000 });
    for (let i = 0; i < 20; i++) ring.push(msg("x".repeat(200)));
    expect(ring.bytes).toBeLessThanOrEqual(1000);
    expect(ring.size).toBeLessThan(20);
    expect(ring.oldestSeq + ring.size - 1).toBe(20);
  });

  test("waitFor wakes immediately on push and on close", async () => {
    const ring = new EventRing();
    const waiting = ring.waitFor(0);
    ring.push(msg("a"));
    await waiting;
    const closing = ring.waitFor(1);
    ring.close();
    await closing;
    expect(ring.read(0, 10).events.map((e) => e.seq)).toEqual([1]);
    expect(ring.closed).toBe(true);
  });
});

function normalizer(emit: RunEventBody[], secrets: string[] = []) {
  return new EventNormalizer({ projectRoot: "/work/p", redactor: new Redactor(secrets), emit: (b) => emit.push(b) });
}
const chunk = (text: string) => ({
  sessionUpdate: "agent_message_chunk" as const,
  content: { type: "text" as const, text },
});

describe("normalization", () => {
  test("coalesces consecutive chunks up to the text bound, and cuts oversized chunks", () => {
    const out: RunEventBody[] = [];
    const n = normalizer(out);
    n.handle(chunk("Hello "));
    n.handle(chunk("world"));
    n.handle({ sessionUpdate: "agent_thought_chunk", content: { type: "text", text: "hmm" } });
    n.handle(chunk("é".repeat(3000)));
    n.flush();
    expect(out[0]).toEqual({ kind: "agent_message", text: "Hello world", truncated: false });
    expect(out[1]).toEqual({ kind: "reasoning", text: "hmm", truncated: false });
    const big = out[2] as { text: string; truncated: boolean };
    expect(big.truncated).toBe(true);
    expect(utf8Length(big.text)).toBeLessThanOrEqual(MAX_EVENT_TEXT_BYTES);
    for (const body of out) RunEvent.parse({ ...body, seq: 1, at: "x" });
  });

  test("redacts mapped values (≥ 6 chars), also when split across coalesced chunks", () => {
    const out: RunEventBody[] = [];
    const n = normalizer(out, ["supersecretvalue", "abc"]);
    n.handle(chunk("token=supersec"));
    n.handle(chunk("retvalue and abc"));
    n.flush();
    expect(out).toEqual([{ kind: "agent_message", text: "token=[redacted] and abc", truncated: false }]);
  });

  test("a secret split across a timer flush or the size bound never appears, nor do its halves adjoin", () => {
    const secret = "sk-live-0123456789abcdef";
    const check = (out: RunEventBody[]) => {
      const texts = out.map((b) => (b as { text: string }).text);
      for (const t of texts) {
        expect(t).not.toContain(secret);
        expect(utf8Length(t)).toBeLessThanOrEqual(MAX_EVENT_TEXT_BYTES);
      }
      for (let i = 1; i < texts.length; i++) expect(`${texts[i - 1]}${texts[i]}`).not.toContain(secret);
      expect(texts.join("")).toContain("[redacted]");
      for (const body of out) RunEvent.parse({ ...body, seq: 1, at: "x" });
    };
    for (const cut of [1, 8, secret.length - 1]) {
      // The owner's timer flush falls between the two halves.
      const timed: RunEventBody[] = [];
      const n = normalizer(timed, [secret]);
      n.handle(chunk(`key=${secret.slice(0, cut)}`));
      n.flushStreamed();
      n.handle(chunk(`${secret.slice(cut)} done`));
      n.flushStreamed();
      n.flush();
      check(timed);
      expect(timed.map((b) => (b as { text: string }).text).join("")).toBe("key=[redacted] done");

      // The 4 KiB bound falls between the two halves.
      const bounded: RunEventBody[] = [];
      const m = normalizer(bounded, [secret]);
      m.handle(chunk("x".repeat(MAX_EVENT_TEXT_BYTES - cut)));
      m.handle(chunk(secret.slice(0, cut)));
      m.handle(chunk(`${secret.slice(cut)}${"y".repeat(MAX_EVENT_TEXT_BYTES - 10)}`));
      m.flush();
      check(bounded);
    }
    // A held-back tail that was not a secret after all is emitted with the next text or at the final flush.
    const out: RunEventBody[] = [];
    const n = normalizer(out, [secret]);
    n.handle(chunk("ends with sk-li"));
    n.flushStreamed();
    expect(out).toEqual([{ kind: "agent_message", text: "ends with ", truncated: false }]);
    n.handle({ sessionUpdate: "agent_thought_chunk", content: { type: "text", text: "hmm" } });
    n.flush();
    expect(out.slice(1)).toEqual([
      { kind: "agent_message", text: "sk-li", truncated: false },
      { kind: "reasoning", text: "hmm", truncated: false },
    ]);
  });

  test("usage cost_currency is an ISO 4217 code or null", () => {
    const out: RunEventBody[] = [];
    const n = normalizer(out);
    for (const currency of ["USD", "usd", "EURO", "€", "sk-1234", "US"]) {
      n.handle({ sessionUpdate: "usage_update", used: 1, size: 2, cost: { amount: 0.5, currency } });
      n.flush(); // one flush window each: consecutive usage inside one window collapses to the latest
    }
    expect(out.map((b) => (b as { cost_currency: string | null }).cost_currency)).toEqual([
      "USD",
      null,
      null,
      null,
      null,
      null,
    ]);
  });

  test("the project root's absolute path is made relative inside any event text", () => {
    const out: RunEventBody[] = [];
    const n = new EventNormalizer({
      projectRoot: "/work/p",
      redactor: new Redactor([], "/work/p"),
      emit: (b) => out.push(b),
    });
    n.handle({ sessionUpdate: "tool_call", toolCallId: "t1", title: "Edit /work/p/src/a.js in /work/p", kind: "edit" });
    n.flush();
    expect(out[0]).toMatchObject({ title: "Edit src/a.js in ." });
    const r = new Redactor([], "/work/p");
    expect(r.redact("/work/pp/x and /work/p. and /work/p/")).toBe("/work/pp/x and .. and ");
  });

  test("paths are relative to the project root; outside paths are masked", () => {
    expect(relativizePath("/work/p", "/work/p/src/a.js")).toBe("src/a.js");
    expect(relativizePath("/work/p", "src/b.js")).toBe("src/b.js");
    expect(relativizePath("/work/p", "/work/p/../q/c.js")).toBe(OUTSIDE_PROJECT_PATH);
    expect(relativizePath("/work/p", "/work/pp/x")).toBe(OUTSIDE_PROJECT_PATH);
    expect(relativizePath("/work/p", "/etc/passwd")).toBe(OUTSIDE_PROJECT_PATH);
  });

  test("unknown and ignored variants are counted, not emitted; tool updates keep earlier title and kind", () => {
    const out: RunEventBody[] = [];
    const n = normalizer(out);
    n.handle({ sessionUpdate: "user_message_chunk", content: { type: "text", text: "echo" } });
    n.handle({ sessionUpdate: "something_new" } as never);
    n.handle({
      sessionUpdate: "tool_call",
      toolCallId: "t1",
      title: "Read file",
      kind: "read",
      rawInput: { secret: 1 },
    });
    n.handle({ sessionUpdate: "tool_call_update", toolCallId: "t1", status: "completed" });
    n.flush();
    expect(n.ignoredUpdates).toBe(2);
    expect(out).toEqual([
      { kind: "tool_activity", tool_call_id: "t1", title: "Read file", tool_kind: "read", status: "pending" },
      { kind: "tool_activity", tool_call_id: "t1", title: "Read file", tool_kind: "read", status: "completed" },
    ]);
  });
});

describe("config sequencing units", () => {
  const select = (id: string, current: string, values: string[]): SessionConfigOption => ({
    type: "select",
    id,
    name: id,
    currentValue: current,
    options: values.map((value) => ({ value, name: value })),
  });

  test("a -32602 from the agent on a caller key is invalid_config (fix_input at the run level)", async () => {
    const result = await sequenceConfig({
      forced: {},
      caller: { model: "big" },
      allowed: ["model"],
      initial: [select("model", "small", ["small", "big"])],
      set: async (): Promise<RequestOutcome<SessionConfigOption[]>> => ({ kind: "rpc_error", code: -32602 }),
    });
    expect(result).toMatchObject({ ok: false, failureKind: "invalid_config" });
  });

  test("a forced value the refreshed list does not show is forced_config_unsatisfied", async () => {
    const result = await sequenceConfig({
      forced: { mode: "ask" },
      caller: {},
      allowed: [],
      initial: [select("mode", "code", ["ask", "code"])],
      set: async () => ({ kind: "ok", value: [select("mode", "code", ["ask", "code"])] }),
    });
    expect(result).toMatchObject({ ok: false, failureKind: "forced_config_unsatisfied" });
  });

  test("empty caller and forced config send no calls", async () => {
    let calls = 0;
    const result = await sequenceConfig({
      forced: {},
      caller: {},
      allowed: ["model"],
      initial: [select("model", "small", ["small"])],
      set: async () => {
        calls++;
        return { kind: "rpc_error", code: -1 };
      },
    });
    expect(result).toMatchObject({ ok: true, effective: [{ id: "model", value: "small" }] });
    expect(calls).toBe(0);
  });

  test("the snapshot records every advertised option, forced and caller keys first, string values redacted", async () => {
    const account = "team-account-1";
    const result = await sequenceConfig({
      forced: { mode: "ask" },
      caller: { model: "big" },
      allowed: ["model"],
      initial: [
        select("mode", "code", ["ask", "code"]),
        select("model", "small", ["small", "big"]),
        select("account", account, [account]),
      ],
      // Stands in for the run's redactor, as if "big" were a mapped env value.
      redact: (text) => (text === "big" ? "[redacted]" : text),
      set: async (id, value) => ({
        kind: "ok",
        value: [
          select("mode", id === "mode" ? String(value) : "ask", ["ask", "code"]),
          select("model", id === "model" ? String(value) : "small", ["small", "big"]),
          select("account", account, [account]),
        ],
      }),
    });
    expect(result).toMatchObject({
      ok: true,
      effective: [
        { id: "mode", value: "ask" },
        { id: "model", value: "[redacted]" },
        { id: "account", value: account },
      ],
    });
  });

  test("the snapshot is bounded: beyond MAX_EFFECTIVE_CONFIG_ENTRIES advertised options, forced and caller keys stay", async () => {
    const many = Array.from({ length: MAX_EFFECTIVE_CONFIG_ENTRIES + 10 }, (_, i) => select(`opt_${i}`, "a", ["a"]));
    let options = [...many, select("mode", "code", ["ask", "code"]), select("model", "small", ["small", "big"])];
    const result = await sequenceConfig({
      forced: { mode: "ask" },
      caller: { model: "big" },
      allowed: ["model"],
      initial: options,
      set: async (id, value) => {
        options = options.map((o) =>
          o.id === id ? select(id, String(value), id === "mode" ? ["ask", "code"] : ["small", "big"]) : o,
        );
        return { kind: "ok", value: options };
      },
    });
    if (!result.ok) throw new Error("sequencing failed");
    expect(result.effective).toHaveLength(MAX_EFFECTIVE_CONFIG_ENTRIES);
    expect(result.effective.slice(0, 2)).toEqual([
      { id: "mode", value: "ask" },
      { id: "model", value: "big" },
    ]);
  });
});

describe("Redactor", () => {
  test("redacts the longer of two overlapping secrets whole, never leaving its tail", () => {
    const short = "token-abcdef";
    const long = `${short}-and-its-long-tail`;
    // Either order of declaration: the longest secret is matched first.
    for (const secrets of [
      [short, long],
      [long, short],
    ]) {
      expect(new Redactor(secrets).redact(`key=${long}; other=${short}`)).toBe(`key=${REDACTED}; other=${REDACTED}`);
    }
  });

  test("without a project root holds back only what may start a secret", () => {
    const r = new Redactor(["sk-live-0123456789"]);
    expect(r.heldSuffixLength("plain text ending in S")).toBe(0);
    expect(r.heldSuffixLength("key=sk-li")).toBe("sk-li".length);
  });
});
