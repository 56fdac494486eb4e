/**
 * The durable half of the link leases (link/leases.ts, design §5): table `runner_link_leases` in the
 * Server's state DB (schema step 7) holds, per runner id, the sha256 of the resume secret its holder was
 * given and when the lease runs out (epoch ms). A restarted Server reads it, so a hello without that
 * secret is refused until the lease would have expired, while the real Runner — which keeps the secret in
 * memory across reconnects — resumes at once. Never the secret itself: a copy of the DB does not let
 * anyone resume a link.
 */
import { createHash } from "node:crypto";
import type BetterSqlite3 from "better-sqlite3";

export interface PersistedLease {
  /** sha256 of the resume secret, 32 bytes. */
  secretHash: Buffer;
  expiresAtMs: number;
}

export interface LeaseStore {
  get(runnerId: string): PersistedLease | undefined;
  /** Write (or overwrite) these leases in one transaction. */
  save(entries: readonly { runnerId: string; secretHash: Buffer; expiresAtMs: number }[]): void;
  delete(runnerId: string): void;
}

export function hashSecret(secret: string): Buffer {
  return createHash("sha256").update(secret, "utf8").digest();
}

export class SqliteLeaseStore implements LeaseStore {
  readonly #get: BetterSqlite3.Statement<[string]>;
  readonly #put: BetterSqlite3.Statement<[string, string, number]>;
  readonly #delete: BetterSqlite3.Statement<[string]>;
  readonly #saveMany: (entries: readonly { runnerId: string; secretHash: Buffer; expiresAtMs: number }[]) => void;

  /**
   * A failed read or write is reported to `onError` and treated as "no written-down lease": the
   * in-memory lease still guards a live link; only the restart case falls back to the first hello.
   */
  constructor(
    db: BetterSqlite3.Database,
    private readonly onError: (err: unknown) => void = () => {},
  ) {
    this.#get = db.prepare<[string]>("SELECT secret_hash, expires_ms FROM runner_link_leases WHERE runner_id = ?");
    this.#put = db.prepare<[string, string, number]>(
      `INSERT INTO runner_link_leases (runner_id, secret_hash, expires_ms) VALUES (?, ?, ?)
       ON CONFLICT (runner_id) DO UPDATE SET secret_hash = excluded.secret_hash, expires_ms = excluded.expires_ms`,
    );
    this.#delete = db.prepare<[string]>("DELETE FROM runner_link_leases WHERE runner_id = ?");
    this.#saveMany = db.transaction((entries) => {
      for (const e of entries) this.#put.run(e.runnerId, e.secretHash.toString("hex"), Math.ceil(e.expiresAtMs));
    });
  }

  get(runnerId: string): PersistedLease | undefined {
    try {
      const row = this.#get.get(runnerId) as { secret_hash: string; expires_ms: number } | undefined;
      return row && { secretHash: Buffer.from(row.secret_hash, "hex"), expiresAtMs: row.expires_ms };
    } catch (err) {
      this.onError(err);
      return undefined;
    }
  }

  save(entries: readonly { runnerId: string; secretHash: Buffer; expiresAtMs: number }[]): void {
    try {
      if (entries.length > 0) this.#saveMany(entries);
    } catch (err) {
      this.onError(err);
    }
  }

  delete(runnerId: string): void {
    try {
      this.#delete.run(runnerId);
    } catch (err) {
      this.onError(err);
    }
  }
}
