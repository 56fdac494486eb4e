/**
 * The Runner parses each session/update with the SDK's notification schema narrowed to the variant its
 * `sessionUpdate` names: the same accept set and the same output as the SDK's whole schema, for every
 * variant, for invalid updates and for names no variant has.
 */
import { describe, expect, it } from "vitest";
import { z } from "zod";
import {
  bySessionUpdate,
  loadSdkSchemas,
  type SessionNotificationSchema,
  sessionNotificationSchema,
} from "../src/acp/session-update-schema.js";

const sdk = await loadSdkSchemas();
if (!sdk || !sessionNotificationSchema) throw new Error("the SDK's session/update schema did not load");
const whole = sdk.zSessionNotification as SessionNotificationSchema;
const narrowedSdk = sessionNotificationSchema;

const text = { type: "text", text: "hello" };
/** A valid update of every variant of the ACP v1 schema (and extra fields the schema strips or keeps). */
const valid: Record<string, unknown>[] = [
  { sessionUpdate: "user_message_chunk", content: text },
  { sessionUpdate: "agent_message_chunk", content: text, messageId: "m1" },
  { sessionUpdate: "agent_thought_chunk", content: { type: "text", text: "" } },
  { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "a", annotations: { priority: 1 }, x: 1 } },
  { sessionUpdate: "agent_message_chunk", content: { type: "image", data: "aGk=", mimeType: "image/png" } },
  { sessionUpdate: "agent_message_chunk", content: { type: "audio", data: "aGk=", mimeType: "audio/wav" } },
  { sessionUpdate: "user_message_chunk", content: { type: "resource_link", name: "a", uri: "file:///a" } },
  { sessionUpdate: "agent_thought_chunk", content: { type: "resource", resource: { uri: "file:///a", text: "x" } } },
  { sessionUpdate: "tool_call", toolCallId: "t1", title: "Read", kind: "read", status: "in_progress" },
  { sessionUpdate: "tool_call", toolCallId: "t1", title: "Read", kind: "not-a-kind", extra: 1 },
  {
    sessionUpdate: "tool_call",
    toolCallId: "t2",
    title: "Edit",
    content: [{ type: "diff", path: "/p/a.ts", oldText: "a", newText: "b" }, { type: "bogus" }],
    locations: [{ path: "/p/a.ts", line: 3 }],
  },
  { sessionUpdate: "tool_call_update", toolCallId: "t1", status: "completed" },
  { sessionUpdate: "tool_call_update", toolCallId: "t1", status: "nonsense", title: null },
  { sessionUpdate: "plan", entries: [{ content: "step", priority: "high", status: "pending" }] },
  { sessionUpdate: "available_commands_update", availableCommands: [{ name: "init", description: "d" }] },
  { sessionUpdate: "current_mode_update", currentModeId: "code" },
  { sessionUpdate: "config_option_update", configOptions: [] },
  { sessionUpdate: "session_info_update", title: "A title" },
  { sessionUpdate: "usage_update", used: 10, size: 100 },
];
const invalid: unknown[] = [
  { sessionUpdate: "tool_call", toolCallId: "t1" }, // title is required
  { sessionUpdate: "tool_call_update", status: "completed" }, // toolCallId is required
  { sessionUpdate: "agent_message_chunk", content: { type: "text" } },
  { sessionUpdate: "agent_message_chunk", content: { type: "image", mimeType: "image/png" } },
  { sessionUpdate: "agent_message_chunk", content: { type: "bogus", text: "x" } },
  { sessionUpdate: "agent_message_chunk", content: { text: "x" } },
  { sessionUpdate: "agent_message_chunk", content: "x" },
  { sessionUpdate: "agent_message_chunk", content: { type: "resource", resource: { uri: 1 } } },
  { sessionUpdate: "agent_message_chunk" },
  { sessionUpdate: "no_such_variant", content: text },
  { sessionUpdate: "constructor", content: text },
  { sessionUpdate: 42, content: text },
  { content: text },
  "agent_message_chunk",
  null,
];

const notification = (update: unknown, extra: Record<string, unknown> = {}) => ({
  sessionId: "s1",
  update,
  ...extra,
});

describe("session/update schema, narrowed by sessionUpdate", () => {
  it("accepts and outputs exactly what the SDK's whole schema does, for every variant and for invalid updates", () => {
    const inputs = [
      ...valid.map((u) => notification(u)),
      ...valid.map((u) => notification(u, { _meta: { trace: "x" } })),
      notification(valid[0], { _meta: "not a record" }),
      { update: valid[0] },
      { sessionId: 7, update: valid[3] },
      ...invalid.map((u) => notification(u)),
      null,
      "session/update",
      [],
    ];
    for (const input of inputs) {
      const expected = whole.safeParse(input);
      const actual = narrowedSdk.safeParse(input);
      expect({ input, success: actual.success }).toEqual({ input, success: expected.success });
      // Same output, field order included (events are built from it and serialized).
      if (expected.success && actual.success) expect(JSON.stringify(actual.data)).toBe(JSON.stringify(expected.data));
    }
    // Every valid sample is accepted (the corpus really covers the variants).
    for (const u of valid) expect(narrowedSdk.safeParse(notification(u)).success).toBe(true);
  });

  it("has one narrowed schema per union variant of the SDK's schema", () => {
    const union = (sdk.zSessionUpdate as { _zod: { def: { options: unknown[] } } })._zod.def.options;
    const names = [...new Set(valid.map((u) => u.sessionUpdate))];
    expect(narrowedSdk.variants).toHaveLength(union.length);
    expect(narrowedSdk.variants).toEqual(expect.arrayContaining(names));
  });

  it("keeps the whole schema when building a narrowed form throws", () => {
    const schema = z.object({
      sessionId: z.string(),
      update: z.union([z.object({ a: z.string() }).and(z.object({ sessionUpdate: z.literal("x") }))]),
    });
    const refuse = () => {
      throw new Error("refused");
    };
    const throwing = new Proxy(schema, {
      get: (target, key, receiver) => (key === "extend" ? refuse : Reflect.get(target, key, receiver)),
    }) as unknown as SessionNotificationSchema;
    expect(bySessionUpdate(throwing)).toBe(throwing);
  });

  it("keeps the whole schema when the union is not made of variants named by distinct literals", () => {
    const duplicate = z.object({
      sessionId: z.string(),
      update: z.union([
        z.object({ a: z.string() }).and(z.object({ sessionUpdate: z.literal("x") })),
        z.object({ b: z.string() }).and(z.object({ sessionUpdate: z.literal("x") })),
      ]),
    }) as unknown as SessionNotificationSchema;
    expect(bySessionUpdate(duplicate)).toBe(duplicate);
    expect(bySessionUpdate(duplicate).variants).toBeUndefined();
    const plain = z.object({
      sessionId: z.string(),
      update: z.union([z.object({ sessionUpdate: z.literal("x") }), z.string()]),
    }) as unknown as SessionNotificationSchema;
    expect(bySessionUpdate(plain)).toBe(plain);
  });

  it("narrows a distinct-literal union: the right variant's check and output, the whole schema's verdict otherwise", () => {
    const schema = z.object({
      sessionId: z.string(),
      update: z.union([
        z.object({ a: z.string() }).and(z.object({ sessionUpdate: z.literal("x") })),
        z.object({ b: z.number().transform((n) => n * 2) }).and(z.object({ sessionUpdate: z.literal("y") })),
        z
          .object({
            inner: z.union([
              z.object({ t: z.string() }).and(z.object({ type: z.literal("t") })),
              z.object({ n: z.number() }).and(z.object({ type: z.literal("n") })),
            ]),
          })
          .and(z.object({ sessionUpdate: z.literal("nested") })),
      ]),
    }) as unknown as SessionNotificationSchema;
    const narrowed = bySessionUpdate(schema);
    expect(narrowed.variants).toEqual(["x", "y", "nested"]);
    for (const inner of [
      { type: "t", t: "a", extra: 1 },
      { type: "n", n: 1 },
      { type: "n", t: "a" },
      { type: "q" },
      7,
    ]) {
      const input = { sessionId: "s", update: { sessionUpdate: "nested", inner } };
      expect(JSON.stringify(narrowed.safeParse(input).success && narrowed.safeParse(input))).toBe(
        JSON.stringify(schema.safeParse(input).success && schema.safeParse(input)),
      );
    }
    expect(
      narrowed.safeParse({ sessionId: "s", update: { sessionUpdate: "nested", inner: { type: "n", n: 1 } } }),
    ).toMatchObject({ success: true, data: { update: { sessionUpdate: "nested", inner: { n: 1, type: "n" } } } });
    expect(narrowed.safeParse({ sessionId: "s", update: { sessionUpdate: "y", b: 2 } })).toEqual(
      schema.safeParse({ sessionId: "s", update: { sessionUpdate: "y", b: 2 } }),
    );
    expect(narrowed.safeParse({ sessionId: "s", update: { sessionUpdate: "y", b: 2 } })).toMatchObject({
      success: true,
      data: { update: { sessionUpdate: "y", b: 4 } },
    });
    expect(narrowed.safeParse({ sessionId: "s", update: { sessionUpdate: "x", b: 2 } }).success).toBe(false);
    expect(narrowed.safeParse({ sessionId: "s", update: { sessionUpdate: "z", a: "" } }).success).toBe(false);
  });

  it("keeps a variant's intersection where one object would not be the same check (strict, loose, refined)", () => {
    const tag = (name: string) => z.object({ sessionUpdate: z.literal(name) });
    const schema = z.object({
      sessionId: z.string(),
      update: z.union([
        // A strict left side: zod reports a key only if no side of the intersection knows it.
        z.object({ a: z.string() }).strict().and(tag("strict")),
        // A loose left side keeps unknown keys, `sessionUpdate` included.
        z.object({ a: z.string() }).loose().and(tag("loose")),
        z
          .object({ a: z.string() })
          .refine((v) => v.a !== "no")
          .and(tag("refined")),
        z.object({ a: z.string() }).and(tag("plain")),
      ]),
    }) as unknown as SessionNotificationSchema;
    const narrowed = bySessionUpdate(schema);
    expect(narrowed.variants).toEqual(["strict", "loose", "refined", "plain"]);
    for (const name of ["strict", "loose", "refined", "plain"]) {
      for (const update of [
        { sessionUpdate: name, a: "yes", extra: 1 },
        { sessionUpdate: name, a: "no" },
      ]) {
        const input = { sessionId: "s", update };
        expect(JSON.stringify(narrowed.safeParse(input).success && narrowed.safeParse(input))).toBe(
          JSON.stringify(schema.safeParse(input).success && schema.safeParse(input)),
        );
      }
    }
    expect(narrowed.safeParse({ sessionId: "s", update: { sessionUpdate: "refined", a: "no" } }).success).toBe(false);
    expect(narrowed.safeParse({ sessionId: "s", update: { sessionUpdate: "loose", a: "x", extra: 1 } })).toMatchObject({
      data: { update: { sessionUpdate: "loose", a: "x", extra: 1 } },
    });
  });
});
