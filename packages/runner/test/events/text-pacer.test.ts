/**
 * Adaptive coalescing of streamed text (events/text-pacer.ts): a chunk after a quiet
 * period becomes an event at the next setImmediate; a flood is held up to
 * COALESCE_MS per event, so it still coalesces into few events. The
 * normalizer is wired to the pacer exactly as runs/manager.ts wires it.
 */
import type { RunEventBody } from "@webcodex/protocol";
import { MAX_EVENT_TEXT_BYTES } from "@webcodex/protocol";
import { afterEach, describe, expect, test, vi } from "vitest";
import { EventNormalizer } from "../../src/events/normalize.js";
import { Redactor } from "../../src/events/redactor.js";
import { COALESCE_MS, FLOOD_GAP_MS, TextPacer } from "../../src/events/text-pacer.js";

const chunk = (text: string) => ({
  sessionUpdate: "agent_message_chunk" as const,
  content: { type: "text" as const, text },
});

function wired(now: () => number, secrets: string[] = []) {
  const out: RunEventBody[] = [];
  let normalizer!: EventNormalizer;
  const pacer = new TextPacer({ flush: () => normalizer.flushStreamed(), now });
  normalizer = new EventNormalizer({
    projectRoot: "/work/p",
    redactor: new Redactor(secrets),
    emit: (body) => {
      if (body.kind === "agent_message" || body.kind === "reasoning") pacer.noteFlush();
      out.push(body);
    },
    onPending: () => pacer.schedule(),
  });
  return { out, normalizer, pacer };
}

const texts = (out: RunEventBody[]) => out.map((b) => (b as { text: string }).text);

afterEach(() => {
  vi.useRealTimers();
});

describe("text pacer", () => {
  test("a chunk after a quiet period is an event at the next setImmediate, long before a COALESCE_MS timer", () => {
    vi.useFakeTimers();
    const { out, normalizer } = wired(() => Date.now());
    normalizer.handle(chunk("tick 0\n"));
    normalizer.handle(chunk("tick 0 more\n")); // same stdout read: merged into the same event
    expect(out).toEqual([]);
    expect(vi.getTimerCount()).toBe(1); // the one arranged flush
    vi.advanceTimersByTime(0); // the immediate, with no clock time passing
    expect(texts(out)).toEqual(["tick 0\ntick 0 more\n"]);
    expect(vi.getTimerCount()).toBe(0); // nothing else (no COALESCE_MS hold) was armed
  });

  test("quiet, then a second chunk within FLOOD_GAP_MS waits for the COALESCE_MS hold", () => {
    vi.useFakeTimers();
    const { out, normalizer } = wired(() => Date.now());
    normalizer.handle(chunk("a"));
    vi.advanceTimersByTime(0); // the immediate
    expect(texts(out)).toEqual(["a"]);
    vi.advanceTimersByTime(FLOOD_GAP_MS - 5);
    normalizer.handle(chunk("b"));
    vi.advanceTimersByTime(0);
    expect(texts(out)).toEqual(["a"]); // held: the stream is flooding
    normalizer.handle(chunk("c"));
    vi.advanceTimersByTime(COALESCE_MS - 1);
    expect(texts(out)).toEqual(["a"]);
    vi.advanceTimersByTime(1);
    expect(texts(out)).toEqual(["a", "bc"]);
    // Quiet again (> FLOOD_GAP_MS since the last flush): immediate once more.
    vi.advanceTimersByTime(FLOOD_GAP_MS + 1);
    normalizer.handle(chunk("d"));
    vi.advanceTimersByTime(0);
    expect(texts(out)).toEqual(["a", "bc", "d"]);
  });

  test("a flood of 10k chunks (one per ms) coalesces into far fewer events, every chunk once, in order", () => {
    vi.useFakeTimers();
    const { out, normalizer } = wired(() => Date.now());
    const expected: string[] = [];
    for (let i = 0; i < 10_000; i++) {
      const text = `chunk ${String(i).padStart(5, "0")} of the flood\n`;
      expected.push(text);
      normalizer.handle(chunk(text));
      vi.advanceTimersByTime(1);
    }
    vi.advanceTimersByTime(COALESCE_MS);
    normalizer.flush();
    expect(out.length).toBeLessThan(1000);
    expect(out.every((b) => b.kind === "agent_message" && !b.truncated)).toBe(true);
    expect(Math.max(...texts(out).map((t) => Buffer.byteLength(t)))).toBeLessThanOrEqual(MAX_EVENT_TEXT_BYTES);
    expect(texts(out).join("")).toBe(expected.join(""));
  });

  test("a secret split across a quiet-stream flush never appears in one event", () => {
    vi.useFakeTimers();
    const secret = "sk-live-0123456789abcdef";
    const { out, normalizer } = wired(() => Date.now(), [secret]);
    normalizer.handle(chunk(`key=${secret.slice(0, 10)}`));
    vi.advanceTimersByTime(0);
    vi.advanceTimersByTime(FLOOD_GAP_MS + 1);
    normalizer.handle(chunk(`${secret.slice(10)} done`));
    vi.advanceTimersByTime(COALESCE_MS + FLOOD_GAP_MS);
    normalizer.flush();
    for (const t of texts(out)) expect(t).not.toContain(secret);
    expect(texts(out).join("")).toBe("key=[redacted] done");
  });

  test("stop() drops an arranged flush", () => {
    vi.useFakeTimers();
    const { out, normalizer, pacer } = wired(() => Date.now());
    normalizer.handle(chunk("x"));
    pacer.stop();
    vi.advanceTimersByTime(COALESCE_MS * 2);
    expect(out).toEqual([]);
  });
});
