/**
 * A spent refresh token's successor pair, sealed for the reuse grace window (oauth/store.ts's
 * header): AES-256-GCM under a key derived (HKDF) from the spent refresh token itself, which the
 * store only holds as a sha256, so a row cannot be opened without the token in hand.
 */
import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from "node:crypto";
import type { IssuedPair } from "./rows.js";

export interface SealedPair extends IssuedPair {
  scopes: string[];
}

const SUCCESSOR_KDF_SALT = "webcodex oauth refresh successor v1";
const GCM_IV_BYTES = 12;
const GCM_TAG_BYTES = 16;

/** The successor key: HKDF-SHA256 of the spent refresh token, bound to its row. Never the stored sha256. */
function successorKey(refresh: string, tokenHash: string): Buffer {
  return Buffer.from(hkdfSync("sha256", refresh, SUCCESSOR_KDF_SALT, tokenHash, 32));
}

export function sealSuccessor(refresh: string, tokenHash: string, pair: SealedPair): Buffer {
  const iv = randomBytes(GCM_IV_BYTES);
  const cipher = createCipheriv("aes-256-gcm", successorKey(refresh, tokenHash), iv);
  cipher.setAAD(Buffer.from(tokenHash, "utf8"));
  const body = Buffer.concat([cipher.update(JSON.stringify(pair), "utf8"), cipher.final()]);
  return Buffer.concat([iv, cipher.getAuthTag(), body]);
}

export function openSuccessor(refresh: string, tokenHash: string, sealed: Buffer): SealedPair | null {
  if (sealed.length <= GCM_IV_BYTES + GCM_TAG_BYTES) return null;
  try {
    const decipher = createDecipheriv(
      "aes-256-gcm",
      successorKey(refresh, tokenHash),
      sealed.subarray(0, GCM_IV_BYTES),
    );
    decipher.setAAD(Buffer.from(tokenHash, "utf8"));
    decipher.setAuthTag(sealed.subarray(GCM_IV_BYTES, GCM_IV_BYTES + GCM_TAG_BYTES));
    const text = Buffer.concat([
      decipher.update(sealed.subarray(GCM_IV_BYTES + GCM_TAG_BYTES)),
      decipher.final(),
    ]).toString("utf8");
    const v = JSON.parse(text) as SealedPair;
    if (typeof v.access_token !== "string" || typeof v.refresh_token !== "string" || !Array.isArray(v.scopes))
      return null;
    return v;
  } catch {
    return null;
  }
}
