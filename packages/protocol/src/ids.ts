import { z } from "zod";

/**
 * Prefix of every run id; followed by 26 lowercase RFC 4648 base32 characters. Run, session and AgentTask ids
 * are the first 26 characters of a longer encoding (every character carries 5 bits) and are compared as
 * strings, never decoded: each has one spelling. Ids that are decoded (an MCP task id's MAC) must pass
 * `isCanonicalBase64url`.
 */
export const RUN_ID_PREFIX = "wc_agent_run_";
export const RUN_ID_PATTERN = /^wc_agent_run_[a-z2-7]{26}$/;
/** Operator-chosen ids: projects, providers, runners, config option ids. */
export const LOCAL_ID_PATTERN = /^[a-z0-9][a-z0-9_-]{0,63}$/;
/** Opaque random instance ids (agent, provider, store, server). */
export const INSTANCE_ID_PATTERN = /^[A-Za-z0-9_-]{16,64}$/;
/** Provider-defined ACP config option ids and values are free-form but bounded and printable. */
export const CONFIG_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$/;
/** A hex sha256. */
export const FINGERPRINT_PATTERN = /^[0-9a-f]{64}$/;
/** The link resumption secret of hello.ack / hello (32 random bytes, base64url). */
export const RESUME_SECRET_PATTERN = /^[A-Za-z0-9_-]{43}$/;
/**
 * Tenant tags (design §4.2): the Server's opaque name for the caller a run belongs to, `tn_` + 26 base32
 * characters of an HMAC of the principal under the server secret. The Runner only compares them.
 */
export const TENANT_TAG_PATTERN = /^tn_[a-z2-7]{26}$/;
/** Correlation ids of protocol requests. */
export const REQUEST_ID_PATTERN = /^[A-Za-z0-9_-]{1,64}$/;

export const RunId = z.string().regex(RUN_ID_PATTERN, "must be wc_agent_run_ followed by 26 base32 characters");
export const LocalId = z.string().regex(LOCAL_ID_PATTERN, "must match ^[a-z0-9][a-z0-9_-]{0,63}$");
export const ProjectId = LocalId;
export const ProviderId = LocalId;
export const RunnerId = LocalId;
export const InstanceId = z.string().regex(INSTANCE_ID_PATTERN, "must be 16-64 characters of [A-Za-z0-9_-]");
export const ConfigOptionId = z.string().regex(CONFIG_ID_PATTERN, "must be 1-128 characters of [A-Za-z0-9_.:/-]");
export const Fingerprint = z.string().regex(FINGERPRINT_PATTERN, "must be a lowercase hex sha256");
export const ResumeSecret = z.string().regex(RESUME_SECRET_PATTERN, "must be 43 characters of base64url");
export const TenantTag = z.string().regex(TENANT_TAG_PATTERN, "must be tn_ followed by 26 base32 characters");
export const RequestId = z.string().regex(REQUEST_ID_PATTERN, "must be 1-64 characters of [A-Za-z0-9_-]");

const BASE32_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567";

/** Lowercase RFC 4648 base32 without padding. */
export function base32(bytes: Uint8Array): string {
  let out = "";
  let buffer = 0;
  let bits = 0;
  for (const byte of bytes) {
    buffer = (buffer << 8) | byte;
    bits += 8;
    while (bits >= 5) {
      out += BASE32_ALPHABET[(buffer >>> (bits - 5)) & 31];
      bits -= 5;
    }
    buffer &= (1 << bits) - 1;
  }
  if (bits > 0) out += BASE32_ALPHABET[(buffer << (5 - bits)) & 31];
  return out;
}

/**
 * Whether `text` is the one canonical base64url (no padding) spelling of the bytes it decodes to. Decoders
 * ignore the unused low bits of the last character (and a stray trailing character), so one byte string has
 * several accepted spellings; an id or MAC compared after decoding must be refused unless it re-encodes to
 * itself, or the spellings get past de-duplication and caps as distinct ids.
 */
export function isCanonicalBase64url(text: string): boolean {
  return /^[A-Za-z0-9_-]*$/.test(text) && Buffer.from(text, "base64url").toString("base64url") === text;
}
