/**
 * Run tombstones (design §6.1, "absence is never proof"): what the store keeps
 * of a run after retention pruned its full row — that this store admitted
 * it, a prefix of its intent fingerprint, how it ended and when. Written in
 * the transaction that deletes the row, never pruned, so `run.start` for that
 * id can answer the recorded outcome (or a conflict) instead of admitting the
 * run afresh, and the Server can tell "pruned" from "never admitted".
 *
 * Encoding, chosen for size (a million runs take at most TOMBSTONE_BYTES_PER_RUN
 * MB of database file, about 53 MB measured):
 * - run_key: the 26 base32 characters after `wc_agent_run_`, decoded to 17 bytes;
 * - fingerprint: the first FINGERPRINT_PREFIX_BYTES (128 bits) of the sha256 —
 *   a different intent under the same run id matches it with odds 2^-128;
 * - outcome: one small integer, TOMBSTONE_STATES index × 4 + execution-state
 *   index (both tables append-only: a stored code must keep its meaning);
 * - terminal_at: Unix seconds.
 */
import {
  type ExecutionState,
  RUN_ID_PATTERN,
  RUN_ID_PREFIX,
  type RunState,
  type RunTombstone,
} from "@webcodex/protocol";
import type { DispatchRow, Tombstone } from "./types.js";

/** Bytes of the intent fingerprint a tombstone keeps. */
export const FINGERPRINT_PREFIX_BYTES = 16;
/**
 * Upper bound of the database file bytes one tombstone costs (row, b-tree
 * overhead, half-full pages from random keys), checked by
 * dispatch-store-tombstones.test.ts on 20k tombstones (measured: about 53).
 */
export const TOMBSTONE_BYTES_PER_RUN = 64;

/** Terminal states a tombstone records; index = stored code. Append only. */
const TOMBSTONE_STATES = ["completed", "failed", "cancelled", "lost"] as const satisfies readonly RunState[];
/** Execution states; index = stored code. Append only (a copy, so a protocol reorder cannot change stored codes). */
const TOMBSTONE_EXECUTION = [
  "not_started",
  "started",
  "completed",
  "outcome_unknown",
] as const satisfies readonly ExecutionState[];

export const TOMBSTONES_DDL = `
  CREATE TABLE tombstones (
    run_key     BLOB PRIMARY KEY NOT NULL,
    fingerprint BLOB NOT NULL,
    outcome     INTEGER NOT NULL,
    terminal_at INTEGER NOT NULL
  ) STRICT, WITHOUT ROWID;
`;

export interface StoredTombstone {
  run_key: Buffer;
  fingerprint: Buffer;
  outcome: number;
  terminal_at: number;
}

const BASE32 = "abcdefghijklmnopqrstuvwxyz234567";

/** The 17-byte key of a run id, or null when it is not a run id. */
export function runKey(runId: string): Buffer | null {
  if (!RUN_ID_PATTERN.test(runId)) return null;
  const out = Buffer.alloc(17);
  let acc = 0;
  let bits = 0;
  let i = 0;
  for (const ch of runId.slice(RUN_ID_PREFIX.length)) {
    acc = (acc << 5) | BASE32.indexOf(ch);
    bits += 5;
    if (bits >= 8) {
      out[i++] = (acc >>> (bits - 8)) & 0xff;
      bits -= 8;
      acc &= (1 << bits) - 1;
    }
  }
  if (bits > 0) out[i] = (acc << (8 - bits)) & 0xff;
  return out;
}

/** The prefix of an intent fingerprint (lowercase hex sha256) a tombstone compares. */
export function fingerprintPrefix(fingerprint: string): string {
  return fingerprint.slice(0, FINGERPRINT_PREFIX_BYTES * 2).toLowerCase();
}

export function encodeTombstone(row: DispatchRow): StoredTombstone {
  const key = runKey(row.run_id);
  const state = TOMBSTONE_STATES.indexOf(row.state as (typeof TOMBSTONE_STATES)[number]);
  const exec = TOMBSTONE_EXECUTION.indexOf(row.execution_state);
  if (!key || state < 0 || exec < 0) throw new Error(`tombstone: run ${row.run_id} is not a terminal run`);
  return {
    run_key: key,
    fingerprint: Buffer.from(fingerprintPrefix(row.intent_fingerprint), "hex"),
    outcome: state * 4 + exec,
    terminal_at: Math.floor(Date.parse(row.updated_at) / 1000),
  };
}

export function decodeTombstone(runId: string, stored: StoredTombstone): Tombstone {
  const state = TOMBSTONE_STATES[Math.floor(stored.outcome / 4)];
  const exec = TOMBSTONE_EXECUTION[stored.outcome % 4];
  if (state === undefined || exec === undefined) throw new Error(`tombstone of ${runId}: unknown outcome code`);
  return {
    run_id: runId,
    state,
    execution_state: exec,
    terminal_at: new Date(stored.terminal_at * 1000).toISOString(),
    fingerprintPrefix: stored.fingerprint.toString("hex"),
  };
}

/** The wire shape (no fingerprint prefix). */
export function wireTombstone(t: Tombstone): RunTombstone {
  return { run_id: t.run_id, state: t.state, execution_state: t.execution_state, terminal_at: t.terminal_at };
}
