/**
 * Observation tokens: opaque cursors, HMAC-bound to exactly one run. A token
 * carries the Runner instance whose event sequence it points into and the
 * last seq the holder has seen. A token is never authority: ownership is
 * checked separately on every observe.
 */
import { createHmac, timingSafeEqual } from "node:crypto";
import { lengthPrefixed } from "./identity.js";

const TOKEN_DOMAIN = "webcodex.observation_token.v1";
const PREFIX = "wcobs1.";
/** Upper bound of an encoded token, used to reserve room in the observe budget. */
export const MAX_OBSERVATION_TOKEN_LENGTH = 256;
/**
 * Tokens remembered by cursor, so that the observe loop (verify the caller's token, issue the next one —
 * the same one when nothing happened) does not compute an HMAC twice per call. At the bound the oldest
 * entry is dropped; a token not remembered is computed again, with the same result.
 */
export const OBSERVATION_TOKEN_MEMO_ENTRIES = 4_096;

export interface ObservationCursor {
  run_id: string;
  /** agent_instance_id of the Runner process whose event seqs `seq` refers to. */
  instance: string;
  /** Last event seq delivered (0 = nothing yet). */
  seq: number;
}

export class ObservationTokens {
  readonly #key: Buffer;
  readonly #memo = new Map<string, string>();

  constructor(serverSecret: Buffer) {
    this.#key = createHmac("sha256", serverSecret).update(TOKEN_DOMAIN).digest();
  }

  #mac(runId: string, instance: string, seq: number): Buffer {
    return createHmac("sha256", this.#key)
      .update(lengthPrefixed([runId, instance, String(seq)]))
      .digest()
      .subarray(0, 20);
  }

  issue(cursor: ObservationCursor): string {
    // The run id's length delimits it; the instance and seq never contain "." (see verify's pattern).
    const key = `${cursor.run_id.length}:${cursor.run_id}${cursor.instance}.${cursor.seq}`;
    const known = this.#memo.get(key);
    if (known !== undefined) return known;
    const body = Buffer.from(`${cursor.instance}.${cursor.seq}`, "utf8").toString("base64url");
    const mac = this.#mac(cursor.run_id, cursor.instance, cursor.seq).toString("base64url");
    const token = `${PREFIX}${body}.${mac}`;
    if (this.#memo.size >= OBSERVATION_TOKEN_MEMO_ENTRIES) {
      const oldest = this.#memo.keys().next().value;
      if (oldest !== undefined) this.#memo.delete(oldest);
    }
    this.#memo.set(key, token);
    return token;
  }

  /** The cursor, or null when the token is malformed, forged, or bound to another run. */
  verify(runId: string, token: string): ObservationCursor | null {
    if (typeof token !== "string" || token.length > MAX_OBSERVATION_TOKEN_LENGTH || !token.startsWith(PREFIX)) {
      return null;
    }
    const [body, mac, extra] = token.slice(PREFIX.length).split(".");
    if (body === undefined || mac === undefined || extra !== undefined) return null;
    const decoded = Buffer.from(body, "base64url").toString("utf8");
    const m = /^([A-Za-z0-9_-]{1,64})\.(0|[1-9][0-9]{0,14})$/.exec(decoded);
    if (!m) return null;
    const instance = m[1] ?? "";
    const seq = Number(m[2]);
    // Compare the whole token with its canonical encoding: base64url decoding ignores the unused low
    // bits of a last character, so comparing decoded bytes would accept several spellings of one token.
    const expected = Buffer.from(this.issue({ run_id: runId, instance, seq }), "utf8");
    const given = Buffer.from(token, "utf8");
    if (given.byteLength !== expected.byteLength || !timingSafeEqual(given, expected)) return null;
    return { run_id: runId, instance, seq };
  }
}
