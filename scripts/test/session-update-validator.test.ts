/**
 * The build step that generates the Runner's session/update validators fails closed: a schema construct it
 * cannot map exactly onto the SDK's parse leaves that variant to the SDK (named, with the reason) instead of
 * producing a validator more lenient than the SDK or one whose accepted values the SDK would change.
 */
import { describe, expect, it } from "vitest";
// @ts-expect-error plain .mjs scripts without type declarations
import { closedVariants, compile } from "../build/session-update-validator.mjs";

type Validator = (value: unknown) => boolean;
interface Closed {
  variants: Record<string, unknown>;
  unsupported: Record<string, string>;
}

/** An ACP-shaped schema.json whose one variant `v` is `variant` (merged with its `sessionUpdate` tag). */
function schemaWith(variant: unknown): unknown {
  return {
    $defs: {
      SessionNotification: {
        type: "object",
        properties: {
          sessionId: { type: "string" },
          update: { allOf: [{ $ref: "#/$defs/SessionUpdate" }] },
          _meta: { type: ["object", "null"], additionalProperties: true, "x-deserialize-default-on-error": true },
        },
        required: ["sessionId", "update"],
      },
      SessionUpdate: {
        oneOf: [
          {
            type: "object",
            properties: { sessionUpdate: { type: "string", const: "v" } },
            required: ["sessionUpdate"],
            allOf: [{ $ref: "#/$defs/V" }],
          },
        ],
      },
      V: variant,
    },
  };
}

async function validatorFor(variant: unknown): Promise<Validator> {
  const closed = closedVariants(schemaWith(variant)) as Closed;
  expect(closed.unsupported).toEqual({});
  const source = compile(closed.variants) as string;
  const module = (await import(`data:text/javascript,${encodeURIComponent(source)}`)) as Record<string, Validator>;
  return module.v_v as Validator;
}

const params = (update: Record<string, unknown>, extra: Record<string, unknown> = {}) => ({
  sessionId: "s1",
  update: { sessionUpdate: "v", ...update },
  ...extra,
});

describe("session/update validator generation", () => {
  it("closes every object (zod strips unknown keys) and keeps a record open but without __proto__", async () => {
    const validate = await validatorFor({
      type: "object",
      properties: { a: { type: "string" }, inner: { type: "object", properties: { b: { type: "integer" } } } },
      required: ["a"],
    });
    expect(validate(params({ a: "x", inner: { b: 1 } }))).toBe(true);
    expect(validate(params({ a: "x", unknown: 1 }))).toBe(false);
    expect(validate(params({ a: "x", inner: { b: 1, c: 2 } }))).toBe(false);
    expect(validate(params({ a: "x" }, { other: 1 }))).toBe(false);
    expect(validate(params({ a: "x" }, { _meta: { any: { thing: [1] } } }))).toBe(true);
    expect(validate(params({ a: "x" }, { _meta: JSON.parse('{"__proto__":{"polluted":true}}') }))).toBe(false);
  });

  it("bounds integers as the SDK's zod does: uint32 at 2^32-1, other integers at the safe range", async () => {
    const validate = await validatorFor({
      type: "object",
      properties: {
        line: { type: ["integer", "null"], format: "uint32", minimum: 0 },
        n: { type: "integer" },
      },
    });
    expect(validate(params({ line: 4294967295 }))).toBe(true);
    expect(validate(params({ line: 4294967296 }))).toBe(false);
    expect(validate(params({ line: -1 }))).toBe(false);
    expect(validate(params({ n: Number.MAX_SAFE_INTEGER }))).toBe(true);
    expect(validate(params({ n: 2 ** 53 + 2 }))).toBe(false);
  });

  it("leaves to the SDK a variant with a construct it cannot map exactly, saying which and why", () => {
    const cases: [unknown, RegExp][] = [
      // zod's union takes the first option that parses (stripping b): a closed second branch would differ.
      [
        {
          type: "object",
          properties: {
            x: {
              anyOf: [
                { type: "object", properties: { a: { type: "string" } }, required: ["a"] },
                { type: "object", properties: { a: { type: "string" }, b: { type: "string" } }, required: ["a"] },
              ],
            },
          },
        },
        /update\.x: union branch 1 may parse as 0/,
      ],
      [{ type: "object", properties: { a: { type: "string" } }, additionalProperties: true }, /open object/],
      [{ type: "object", properties: { a: { type: "integer", format: "int32" } } }, /format int32/],
      [{ type: "object", properties: { a: { type: "string", pattern: "^x" } } }, /keyword pattern/],
      [{ type: "object", properties: { a: { type: "string", "x-deserialize-new-rule": true } } }, /annotation/],
      [{ type: "object", properties: { a: { type: "object" } } }, /neither closed nor a record/],
    ];
    for (const [variant, why] of cases) {
      const closed = closedVariants(schemaWith(variant)) as Closed;
      expect(closed.variants).toEqual({});
      expect(closed.unsupported.v).toMatch(why);
    }
  });
});
