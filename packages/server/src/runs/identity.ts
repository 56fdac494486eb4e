/**
 * Run identity (design §6.1): deterministic run ids from the persisted
 * server secret, and canonical intent fingerprints. Pure functions.
 */
import { createHash, createHmac } from "node:crypto";
import { base32, type ConfigMap, RUN_ID_PREFIX } from "@webcodex/protocol";

export const RUN_ID_DOMAIN = "webcodex.coding_agent_run.v1";
export const TENANT_TAG_DOMAIN = "webcodex.tenant.v1";

/** Unambiguous concatenation: each part as a 4-byte big-endian UTF-8 length followed by its bytes. */
export function lengthPrefixed(parts: readonly string[]): Buffer {
  const chunks: Buffer[] = [];
  for (const part of parts) {
    const bytes = Buffer.from(part, "utf8");
    const len = Buffer.alloc(4);
    len.writeUInt32BE(bytes.byteLength);
    chunks.push(len, bytes);
  }
  return Buffer.concat(chunks);
}

export function deriveRunId(serverSecret: Buffer, principalId: string, idempotencyKey: string): string {
  const mac = createHmac("sha256", serverSecret)
    .update(lengthPrefixed([RUN_ID_DOMAIN, principalId, idempotencyKey]))
    .digest();
  return RUN_ID_PREFIX + base32(mac).slice(0, 26);
}

/**
 * The tenant tag `run.start` carries (design §4.2): stable per principal under one server secret, so the
 * Runner can keep each caller's runs on run_as users of their own without learning who the caller is.
 */
export function deriveTenantTag(serverSecret: Buffer, principalId: string): string {
  const mac = createHmac("sha256", serverSecret)
    .update(lengthPrefixed([TENANT_TAG_DOMAIN, principalId]))
    .digest();
  return `tn_${base32(mac).slice(0, 26)}`;
}

/** JSON with object keys sorted at every level; undefined members dropped. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== "object") {
    if (typeof value === "number" && !Number.isFinite(value)) throw new TypeError("non-finite number");
    return JSON.stringify(value) ?? "null";
  }
  if (Array.isArray(value)) return `[${value.map((v) => canonicalJson(v === undefined ? null : v)).join(",")}]`;
  const obj = value as Record<string, unknown>;
  const keys = Object.keys(obj)
    .filter((k) => obj[k] !== undefined)
    .sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(obj[k])}`).join(",")}}`;
}

export interface RunIntent {
  project_id: string;
  provider_id: string;
  prompt: string;
  config: ConfigMap;
  timeout_secs: number | null;
  /** A worktree run's base (design §16); absent leaves the fingerprint exactly as before it existed. */
  base_ref?: string | undefined;
  /** The run this one continues (design §17); null: a fresh session. */
  continue_run_id?: string | null;
}

/** sha256 (hex) of the canonical JSON of every execution-affecting input. */
export function intentFingerprint(intent: RunIntent): string {
  const body = canonicalJson({
    v: 1,
    project_id: intent.project_id,
    provider_id: intent.provider_id,
    prompt: intent.prompt,
    config: intent.config,
    timeout_secs: intent.timeout_secs,
    base_ref: intent.base_ref,
    // Only when set, so the fingerprint of every run that continues nothing stays what it was.
    ...(intent.continue_run_id ? { continue_run_id: intent.continue_run_id } : {}),
  });
  return createHash("sha256").update(body, "utf8").digest("hex");
}
