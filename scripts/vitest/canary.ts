/**
 * A value for a "must not appear" check: long and random, so it cannot turn
 * up by chance in a random id, a hash or another test's output, and a hit
 * means the value itself leaked. The label only helps a reader of a failure.
 */
import { randomBytes } from "node:crypto";

/** Random bytes in a canary: 128 bits, hex-encoded. */
const CANARY_BYTES = 16;

export function canary(label: string): string {
  return `CANARY-${label}-${randomBytes(CANARY_BYTES).toString("hex")}`;
}
