/**
 * Cheaper, equivalent forms of the tagged unions in the ACP SDK's generated
 * zod schemas (used by acp/session-update-schema.ts). The generator writes a
 * tagged union as a plain `z.union` of intersections,
 *
 *     z.union([zTextContent.and(z.object({ type: z.literal("text") })), zImageContent.and(…), …])
 *
 * which zod parses by trying every option in order — each failed option
 * builds its issues and their messages — and each intersection by parsing
 * both sides and deep-merging the results. Because the options are mutually
 * exclusive by their tag literal, and an intersection of two plain stripping
 * objects with disjoint keys accepts exactly what their merged object does
 * and outputs the same fields in the same order, the same check can be made
 * by one object per option, chosen by the tag. Anything not of that exact
 * shape is left as it is.
 */
import { z } from "zod";

/** What this file reads of a zod v4 schema: its definition (`_zod.def`) and, for objects, `extend`. */
export interface ZodLike {
  _zod?: { def?: Record<string, unknown> };
  extend?: (shape: Record<string, unknown>) => unknown;
}

/** Nesting depth up to which fields of flattened options are narrowed too (the ACP schemas need 2). */
const MAX_NARROW_DEPTH = 3;

export const defOf = (schema: unknown): Record<string, unknown> | undefined =>
  (schema as ZodLike | null | undefined)?._zod?.def;

const hasChecks = (def: Record<string, unknown>): boolean => Array.isArray(def.checks) && def.checks.length > 0;

/** `{ key, name }` when `option` is `shape.and(z.object({ [key]: z.literal(name) }))` with a string name, else null. */
export function tagOf(option: unknown): { key: string; name: string } | null {
  const def = defOf(option);
  if (def?.type !== "intersection") return null;
  const shape = defOf(def.right)?.shape as Record<string, unknown> | undefined;
  const keys = shape ? Object.keys(shape) : [];
  if (keys.length !== 1) return null;
  const key = keys[0] as string;
  const literal = defOf(shape?.[key]);
  const values = literal?.type === "literal" ? (literal.values as unknown[]) : null;
  if (!Array.isArray(values) || values.length !== 1 || typeof values[0] !== "string") return null;
  return { key, name: values[0] };
}

/** The options of a union tagged by one key with distinct names, by name; null for anything else. */
export function taggedOptions(union: unknown): { key: string; options: Map<string, unknown> } | null {
  const def = defOf(union);
  const list = def?.type === "union" ? (def.options as unknown[]) : null;
  if (!Array.isArray(list) || list.length === 0) return null;
  let key: string | null = null;
  const options = new Map<string, unknown>();
  for (const option of list) {
    const tag = tagOf(option);
    if (tag === null || (key !== null && tag.key !== key) || options.has(tag.name)) return null;
    key = tag.key;
    options.set(tag.name, option);
  }
  return key === null ? null : { key, options };
}

/**
 * A tagged option `shape.and(z.object({ [key]: literal }))` as the one object `shape.extend({ [key]: literal })`
 * when both sides are plain stripping objects (no catchall) without refinements and `key` is not in `shape`;
 * its fields that are tagged unions are narrowed the same way (`narrowTaggedUnion`). Otherwise the option as is.
 */
export function flatOption(option: unknown, depth = 0): unknown {
  const def = defOf(option);
  const tag = tagOf(option);
  if (def === undefined || tag === null || hasChecks(def)) return option;
  const left = def.left as ZodLike;
  const l = defOf(left);
  const r = defOf(def.right);
  if (l?.type !== "object" || r?.type !== "object" || typeof left.extend !== "function") return option;
  if (l.catchall !== undefined || r.catchall !== undefined || hasChecks(l) || hasChecks(r)) return option;
  const leftShape = l.shape as Record<string, unknown>;
  if (Object.hasOwn(leftShape, tag.key)) return option;
  const fields: Record<string, unknown> = {};
  if (depth < MAX_NARROW_DEPTH) {
    for (const [field, schema] of Object.entries(leftShape)) {
      const narrowed = narrowTaggedUnion(schema, depth + 1);
      if (narrowed !== schema) fields[field] = narrowed;
    }
  }
  fields[tag.key] = (r.shape as Record<string, unknown>)[tag.key];
  return left.extend(fields);
}

/**
 * A tagged union as `z.discriminatedUnion(key, flattened options)`: the option named by the input's tag, and
 * nothing else, parses it. The same schema back when it is not a tagged union or an option does not flatten.
 */
export function narrowTaggedUnion(schema: unknown, depth = 0): unknown {
  const tagged = taggedOptions(schema);
  if (tagged === null) return schema;
  const flat = [...tagged.options.values()].map((option) => flatOption(option, depth));
  if (flat.some((option) => defOf(option)?.type !== "object")) return schema;
  return z.discriminatedUnion(tagged.key, flat as [z.ZodObject, ...z.ZodObject[]]);
}
