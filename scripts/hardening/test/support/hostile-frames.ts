/**
 * fast-check generators of hostile protocol frames: random JSON,
 * known and unknown frame types with wrong-typed or extra fields, mutations of
 * valid frames, huge strings, deep nesting, truncated JSON, binary and invalid
 * UTF-8. Each value says how it must be sent (text or binary).
 */
import { MAX_FRAME_BYTES, RUNNER_FRAME, SERVER_FRAME } from "@webcodex/protocol";
import fc from "fast-check";

export interface HostileFrame {
  kind: string;
  data: string | Buffer;
  binary: boolean;
}

const text = (kind: string, data: string): HostileFrame => ({ kind, data, binary: false });

const FRAME_TYPES = [...Object.values(RUNNER_FRAME), ...Object.values(SERVER_FRAME), "heartbeat", "protocol_error"];

/** A value of a JSON type chosen to be wrong for most fields. */
const wrongValue = fc.oneof(
  fc.constant(null),
  fc.integer(),
  fc.double(),
  fc.boolean(),
  fc.string({ maxLength: 40 }),
  fc.array(fc.integer(), { maxLength: 4 }),
  fc.dictionary(fc.string({ maxLength: 8 }), fc.integer(), { maxKeys: 3 }),
  fc.constant("__proto__"),
  fc.constant({ __proto__: { polluted: true } }),
);

/** Mutates one field of a valid frame so it no longer satisfies the schema (or adds an unknown one). */
function mutations(valid: Record<string, unknown>, name: string): fc.Arbitrary<HostileFrame> {
  const keys = Object.keys(valid);
  return fc.oneof(
    fc
      .tuple(fc.constantFrom(...keys), wrongValue)
      .map(([k, v]) => text(`${name}:wrong-${k}`, JSON.stringify({ ...valid, [k]: v }))),
    fc.constantFrom(...keys).map((k) => {
      const copy = { ...valid };
      delete copy[k];
      return text(`${name}:missing-${k}`, JSON.stringify(copy));
    }),
    fc
      .tuple(fc.string({ minLength: 1, maxLength: 12 }), wrongValue)
      .filter(([k]) => !keys.includes(k))
      .map(([k, v]) => text(`${name}:extra-field`, JSON.stringify({ ...valid, [k]: v }))),
    fc.nat({ max: 10_000 }).map((i) => {
      const json = JSON.stringify(valid);
      return text(`${name}:truncated`, json.slice(0, i % Math.max(1, json.length - 1)));
    }),
  );
}

export function hostileFrames(validFrames: Record<string, Record<string, unknown>>): fc.Arbitrary<HostileFrame> {
  return fc.oneof(
    {
      weight: 3,
      arbitrary: fc.jsonValue({ maxDepth: 6 }).map((v) => text("random-json", JSON.stringify(v) ?? "null")),
    },
    {
      weight: 3,
      arbitrary: fc
        .record(
          {
            type: fc.oneof(fc.constantFrom(...FRAME_TYPES), fc.string({ maxLength: 20 })),
            request_id: fc.oneof(fc.string({ maxLength: 70 }), fc.integer()),
            run_id: fc.oneof(fc.string({ maxLength: 40 }), fc.constant(null)),
            body: fc.jsonValue({ maxDepth: 3 }),
          },
          { requiredKeys: ["type"] },
        )
        .map((v) => text("typed-garbage", JSON.stringify(v))),
    },
    {
      weight: 6,
      arbitrary: fc.oneof(...Object.entries(validFrames).map(([name, frame]) => mutations(frame, name))),
    },
    {
      weight: 1,
      arbitrary: fc
        .integer({ min: 1, max: 64 * 1024 })
        .map((extra) =>
          text("huge-string", JSON.stringify({ type: "heartbeat", sent_at: "x".repeat(MAX_FRAME_BYTES + extra) })),
        ),
    },
    {
      weight: 1,
      arbitrary: fc
        .integer({ min: 17, max: 100_000 })
        .map((d) => text("deep-nesting", `${"[".repeat(d)}${"]".repeat(d)}`)),
    },
    {
      weight: 1,
      arbitrary: fc
        .integer({ min: 17, max: 5_000 })
        .map((d) => text("deep-object", `${'{"type":'.repeat(d)}1${"}".repeat(d)}`)),
    },
    { weight: 1, arbitrary: fc.string({ maxLength: 200 }).map((s) => text("not-json", s)) },
    {
      weight: 1,
      arbitrary: fc.uint8Array({ maxLength: 512 }).map((b) => ({ kind: "binary", data: Buffer.from(b), binary: true })),
    },
    {
      weight: 1,
      // Sent as a text frame whose bytes are not UTF-8: ws closes with 1007.
      arbitrary: fc.uint8Array({ minLength: 1, maxLength: 64 }).map((b) => ({
        kind: "invalid-utf8",
        data: Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from(b)]),
        binary: false,
      })),
    },
  );
}
