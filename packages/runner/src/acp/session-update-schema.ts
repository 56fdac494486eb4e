/**
 * The ACP SDK's own schema of `session/update` params (`zSessionNotification`,
 * generated from the ACP JSON schema), loaded from the SDK package's files:
 * the SDK validates every notification with it but does not export it. The
 * SDK's client parses a session/update twice (its session router, then the
 * `onNotification` handler); with this schema acp/session.ts validates each
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
 * Each variant is also one object instead of an intersection where that is
 * equivalent, and so is each option of a tagged union inside it (a content
 * chunk's `content`): zod parses both sides of an intersection and
 * deep-merges them, which was a third of the remaining cost (acp/tagged-union.ts).
 */
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";
import type { SessionNotification } from "@agentclientprotocol/sdk";
import { defOf, flatOption, taggedOptions, type ZodLike } from "./tagged-union.js";

export interface SessionNotificationSchema {
  safeParse(value: unknown): { success: true; data: SessionNotification } | { success: false };
}

/**
 * `notification` parsed by the variant its `update.sessionUpdate` names (see the file comment), each variant
 * flattened to one object where that is equivalent (acp/tagged-union.ts): the same accept set and output as
 * `notification.safeParse`. Returns `notification` itself when its `update` is not a union of variants each
 * tagged by one distinct `sessionUpdate` literal.
 */
export function bySessionUpdate(
  notification: SessionNotificationSchema,
): SessionNotificationSchema & { readonly variants?: readonly string[] } {
  try {
    return narrowed(notification);
  } catch {
    // A zod build that refuses one of the narrowed forms (e.g. a discriminated union option): the whole schema.
    return notification;
  }
}

function narrowed(
  notification: SessionNotificationSchema,
): SessionNotificationSchema & { readonly variants?: readonly string[] } {
  const whole = notification as SessionNotificationSchema & ZodLike;
  const tagged = taggedOptions((defOf(whole)?.shape as Record<string, unknown> | undefined)?.update);
  if (tagged === null || tagged.key !== "sessionUpdate" || typeof whole.extend !== "function") return notification;
  const variants = new Map<string, SessionNotificationSchema>();
  for (const [name, option] of tagged.options) {
    variants.set(name, whole.extend({ update: flatOption(option) }) as SessionNotificationSchema);
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
