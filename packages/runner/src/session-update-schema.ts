/**
 * The ACP SDK's own schema of `session/update` params (`zSessionNotification`,
 * generated from the ACP JSON schema), loaded from the SDK package's files:
 * the SDK validates every notification with it but does not export it. The
 * SDK's client parses a session/update twice (its session router, then the
 * `onNotification` handler); with this schema acp-session.ts validates each
 * update exactly once and hands it to the turn directly (DESIGN §4.3: the
 * same schema check, on every update). `null` when this SDK build keeps the
 * schema elsewhere: then updates take the SDK's own path, unchanged.
 *
 * The schema's `update` is a plain union of 14 variants, each one a shape
 * intersected with `{ sessionUpdate: <literal> }`, which zod tries in order:
 * a `tool_call` update first fails the three content-chunk variants, and
 * every failed variant builds its issues and their messages (~15 µs per
 * tool update, most of the Runner's CPU in a tool burst). The variants are
 * mutually exclusive by that literal, so the union accepts an update iff the
 * variant named by its `sessionUpdate` accepts it, and yields that variant's
 * output. `bySessionUpdate` therefore parses with the notification schema
 * whose `update` is that one variant — the same check with the same result —
 * and falls back to the whole schema for a name no variant has (which the
 * whole schema rejects) or when the SDK's schema is not shaped as expected.
 * Each variant's intersection is also flattened into one object when that
 * is equivalent (`flatVariant`): zod parses both sides of an intersection
 * and deep-merges them, a third of the remaining cost.
 */
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";
import type { SessionNotification } from "@agentclientprotocol/sdk";

export interface SessionNotificationSchema {
  safeParse(value: unknown): { success: true; data: SessionNotification } | { success: false };
}

/** What this file reads of a zod v4 schema: its definition (`_zod.def`) and, for objects, `extend`. */
interface ZodSchema extends SessionNotificationSchema {
  _zod?: { def?: Record<string, unknown> };
  extend?: (shape: Record<string, unknown>) => SessionNotificationSchema;
}

const defOf = (schema: unknown): Record<string, unknown> | undefined =>
  (schema as ZodSchema | null | undefined)?._zod?.def;

/** The single string literal of `{ sessionUpdate: "<name>" }` on the right of one union variant, else null. */
function variantName(variant: unknown): string | null {
  const def = defOf(variant);
  if (def?.type !== "intersection") return null;
  const shape = defOf(def.right)?.shape as Record<string, unknown> | undefined;
  const literal = defOf(shape?.sessionUpdate);
  const values = literal?.type === "literal" ? (literal.values as unknown[]) : null;
  return Array.isArray(values) && values.length === 1 && typeof values[0] === "string" ? values[0] : null;
}

const hasChecks = (def: Record<string, unknown>): boolean => Array.isArray(def.checks) && def.checks.length > 0;

/**
 * One variant, `shape.and(z.object({ sessionUpdate }))`, as the single object `shape.extend({ sessionUpdate })`
 * when both sides are plain stripping objects without refinements and only the right one has `sessionUpdate`:
 * then both accept the same input and give the same output (the shape's fields, then `sessionUpdate`), and
 * the object skips the intersection's second parse and deep merge. Otherwise the variant as it is.
 */
function flatVariant(variant: unknown): unknown {
  const def = defOf(variant);
  if (def?.type !== "intersection" || hasChecks(def)) return variant;
  const left = def.left as ZodSchema;
  const l = defOf(left);
  const r = defOf(def.right);
  if (l?.type !== "object" || r?.type !== "object" || typeof left.extend !== "function") return variant;
  if (l.catchall !== undefined || r.catchall !== undefined || hasChecks(l) || hasChecks(r)) return variant;
  const leftShape = l.shape as Record<string, unknown>;
  const rightShape = r.shape as Record<string, unknown>;
  const rightKeys = Object.keys(rightShape);
  if (rightKeys.length !== 1 || rightKeys[0] !== "sessionUpdate" || "sessionUpdate" in leftShape) return variant;
  return left.extend({ sessionUpdate: rightShape.sessionUpdate });
}

/**
 * `notification` parsed by the variant its `update.sessionUpdate` names (see the file comment): the same
 * accept set and output as `notification.safeParse`. Returns `notification` itself when its `update` is not a
 * union of variants each named by one distinct `sessionUpdate` literal.
 */
export function bySessionUpdate(
  notification: SessionNotificationSchema,
): SessionNotificationSchema & { readonly variants?: readonly string[] } {
  const whole = notification as ZodSchema;
  const update = (defOf(whole)?.shape as Record<string, unknown> | undefined)?.update;
  const updateDef = defOf(update);
  const options = updateDef?.type === "union" ? (updateDef.options as unknown[]) : null;
  if (!Array.isArray(options) || options.length === 0 || typeof whole.extend !== "function") return notification;
  const variants = new Map<string, SessionNotificationSchema>();
  for (const option of options) {
    const name = variantName(option);
    if (name === null || variants.has(name)) return notification;
    variants.set(name, whole.extend({ update: flatVariant(option) }));
  }
  return {
    /** The `sessionUpdate` names parsed by their own variant (for diagnostics and tests). */
    variants: [...variants.keys()],
    safeParse(value: unknown) {
      const name = (value as { update?: { sessionUpdate?: unknown } } | null)?.update?.sessionUpdate;
      const variant = typeof name === "string" ? variants.get(name) : undefined;
      return (variant ?? notification).safeParse(value);
    },
  };
}

/** The SDK's generated zod module (`zSessionNotification` and friends), or null. */
export async function loadSdkSchemas(): Promise<Record<string, unknown> | null> {
  try {
    // The package's "." entry is dist/v1/stable/acp.js; its generated schemas sit in dist/v1/schema/.
    const entry = createRequire(import.meta.url).resolve("@agentclientprotocol/sdk");
    const file = join(dirname(entry), "..", "schema", "zod.gen.js");
    return (await import(pathToFileURL(file).href)) as Record<string, unknown>;
  } catch {
    return null;
  }
}

async function load(): Promise<(SessionNotificationSchema & { readonly variants?: readonly string[] }) | null> {
  const schema = (await loadSdkSchemas())?.zSessionNotification as SessionNotificationSchema | undefined;
  return typeof schema?.safeParse === "function" ? bySessionUpdate(schema) : null;
}

export const sessionNotificationSchema: (SessionNotificationSchema & { readonly variants?: readonly string[] }) | null =
  await load();
