/**
 * Where link leases (link/leases.ts, design §5) are decided: table `runner_link_leases` in the Server's
 * state database (schema steps 7 and 11) holds, per runner id, the sha256 of the resume secret its holder
 * was given, when the lease runs out (epoch ms) and which connection holds it (`holder`: the holding
 * Server instance's id and its connection). Every Server instance on the database decides a hello
 * through this row, so "one live link per Runner" holds across instances and across a Server restart:
 * until the row expires, only a hello whose secret hashes to it gets in (resumed); any other is refused,
 * while the real Runner — which keeps the secret in memory across reconnects — resumes at once. Never
 * the secret itself: a copy of the database does not let anyone resume a link.
 *
 * Atomicity: `decide` reads the row and writes the outcome in one transaction that first takes the
 * lock `lockName(runnerId)` (state/engine.ts `{lock}`: the row may not exist yet, so a row lock alone
 * could not keep two first hellos apart) and reads the row FOR UPDATE. Two hellos of one Runner — on one
 * instance or on two — are therefore decided one after the other, the second seeing the first's row.
 */
import { createHash } from "node:crypto";
import type { StateEngine, StateQueries } from "../state/engine.js";

/** A lease as the database holds it. */
export interface LeaseRow {
  /** sha256 of the resume secret, 32 bytes. */
  secretHash: Buffer;
  expiresAtMs: number;
  /** The holding connection (`<server instance id>/<n>`); empty for a row written before step 11. */
  holder: string;
}

/** What a decision does to the row: write (or overwrite) it, or leave it as it is. */
export interface LeaseOutcome<T> {
  write: LeaseRow | null;
  result: T;
}

export interface LeaseStore {
  /**
   * Decide over `runnerId`'s row atomically (see the header): `decide` runs inside the transaction with
   * the row (undefined when there is none) and says what to write. It must not throw for a decision.
   */
  decide<T>(runnerId: string, decide: (row: LeaseRow | undefined) => LeaseOutcome<T>): Promise<T>;
  /**
   * Move the expiry of leases still held by the given holders (one transaction). Returns the runner ids
   * whose row another holder took meanwhile (or that is gone): those leases are no longer this one's.
   */
  extend(entries: readonly { runnerId: string; holder: string; expiresAtMs: number }[]): Promise<string[]>;
  /** End the lease of `runnerId` if `holder` still holds it. */
  end(runnerId: string, holder: string): Promise<void>;
}

export function hashSecret(secret: string): Buffer {
  return createHash("sha256").update(secret, "utf8").digest();
}

/**
 * Which connection holds `runnerId`'s lease as the database says now, read with `q` (a transaction's
 * queries: a decision taken in it sees every lease written before, and a lease taken later waits for
 * nothing it could have changed); undefined when no row is held.
 */
export async function leaseHolderIn(q: StateQueries, runnerId: string): Promise<string | undefined> {
  const row = await q.get<{ holder: string }>("SELECT holder FROM runner_link_leases WHERE runner_id = ?", [runnerId]);
  return row?.holder;
}

/** The `{lock}` name every decision about `runnerId`'s lease is taken under. */
export function leaseLockName(runnerId: string): string {
  return `webcodex.link.lease:${runnerId}`;
}

interface Row {
  secret_hash: string;
  expires_ms: number;
  holder: string;
}

/** Leases in the state database (any engine). */
export class StateLeaseStore implements LeaseStore {
  constructor(private readonly db: StateEngine) {}

  async decide<T>(runnerId: string, decide: (row: LeaseRow | undefined) => LeaseOutcome<T>): Promise<T> {
    // The one transaction that makes a lease decision atomic (see the header).
    return await this.db.transaction(
      async (tx) => {
        const row = await tx.get<Row>(
          "SELECT secret_hash, expires_ms, holder FROM runner_link_leases WHERE runner_id = ? FOR UPDATE",
          [runnerId],
        );
        const outcome = decide(
          row && {
            secretHash: Buffer.from(row.secret_hash, "hex"),
            expiresAtMs: Number(row.expires_ms),
            holder: row.holder,
          },
        );
        const w = outcome.write;
        if (w !== null) {
          await tx.run(
            `INSERT INTO runner_link_leases (runner_id, secret_hash, expires_ms, holder) VALUES (?, ?, ?, ?)
             ON CONFLICT (runner_id) DO UPDATE SET secret_hash = excluded.secret_hash,
               expires_ms = excluded.expires_ms, holder = excluded.holder`,
            [runnerId, w.secretHash.toString("hex"), Math.ceil(w.expiresAtMs), w.holder],
          );
        }
        return outcome.result;
      },
      { lock: leaseLockName(runnerId) },
    );
  }

  async extend(entries: readonly { runnerId: string; holder: string; expiresAtMs: number }[]): Promise<string[]> {
    if (entries.length === 0) return [];
    return await this.db.transaction(async (tx) => {
      const lost: string[] = [];
      for (const e of entries) {
        const { changes } = await tx.run(
          "UPDATE runner_link_leases SET expires_ms = ? WHERE runner_id = ? AND holder = ?",
          [Math.ceil(e.expiresAtMs), e.runnerId, e.holder],
        );
        if (changes === 0) lost.push(e.runnerId);
      }
      return lost;
    });
  }

  async end(runnerId: string, holder: string): Promise<void> {
    await this.db.run("DELETE FROM runner_link_leases WHERE runner_id = ? AND holder = ?", [runnerId, holder]);
  }
}

/** Leases in this process only (a hub without a state database: tests). Each decision is synchronous, so atomic. */
export class MemoryLeaseStore implements LeaseStore {
  readonly rows = new Map<string, LeaseRow>();

  async decide<T>(runnerId: string, decide: (row: LeaseRow | undefined) => LeaseOutcome<T>): Promise<T> {
    const outcome = decide(this.rows.get(runnerId));
    if (outcome.write !== null) this.rows.set(runnerId, { ...outcome.write });
    return outcome.result;
  }

  async extend(entries: readonly { runnerId: string; holder: string; expiresAtMs: number }[]): Promise<string[]> {
    const lost: string[] = [];
    for (const e of entries) {
      const row = this.rows.get(e.runnerId);
      if (row?.holder === e.holder) row.expiresAtMs = e.expiresAtMs;
      else lost.push(e.runnerId);
    }
    return lost;
  }

  async end(runnerId: string, holder: string): Promise<void> {
    if (this.rows.get(runnerId)?.holder === holder) this.rows.delete(runnerId);
  }
}
