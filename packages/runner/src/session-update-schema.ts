/**
 * The ACP SDK's own schema of `session/update` params (`zSessionNotification`,
 * generated from the ACP JSON schema), loaded from the SDK package's files:
 * the SDK validates every notification with it but does not export it. The
 * SDK's client parses a session/update twice (its session router, then the
 * `onNotification` handler); with this schema acp-session.ts validates each
 * update exactly once and hands it to the turn directly (DESIGN §4.3: the
 * same schema check, on every update). `null` when this SDK build keeps the
 * schema elsewhere: then updates take the SDK's own path, unchanged.
 */
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";
import type { SessionNotification } from "@agentclientprotocol/sdk";

export interface SessionNotificationSchema {
  safeParse(value: unknown): { success: true; data: SessionNotification } | { success: false };
}

async function load(): Promise<SessionNotificationSchema | null> {
  try {
    // The package's "." entry is dist/v1/stable/acp.js; its generated schemas sit in dist/v1/schema/.
    const entry = createRequire(import.meta.url).resolve("@agentclientprotocol/sdk");
    const file = join(dirname(entry), "..", "schema", "zod.gen.js");
    const mod = (await import(pathToFileURL(file).href)) as { zSessionNotification?: SessionNotificationSchema };
    return typeof mod.zSessionNotification?.safeParse === "function" ? mod.zSessionNotification : null;
  } catch {
    return null;
  }
}

export const sessionNotificationSchema: SessionNotificationSchema | null = await load();
