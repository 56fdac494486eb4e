/**
 * "A live link is never silently replaced" (design §5). The Server holds one lease per runner id: the
 * resume secret it gave the current holder in `hello.ack`, and when it last heard from that holder.
 *
 * | a new hello for runner R                      | outcome                                       |
 * |-----------------------------------------------|-----------------------------------------------|
 * | no lease, or the lease is dead                | granted: new secret, the old link (if any) closed |
 * | live lease, hello carries its secret          | resumed: same secret, the old link closed     |
 * | live lease, no secret or another one          | refused (`link_in_use`), audited as a possible impersonation |
 *
 * A lease is live while its holder was heard from within `timeoutMs` (the heartbeat timeout: the hub
 * terminates a connection that missed a ping, at most two intervals after it was last heard). It
 * outlives an abnormal close of the holder's socket for the rest of that window — a dropped socket is
 * not proof the Runner process is gone — and ends at once when the holder closes its link cleanly
 * (a Runner stopping) or its token is rotated.
 *
 * Every decision is made in the LeaseStore (link/lease-store.ts: the state database, shared by every
 * Server instance and outliving a restart), one transaction per hello: `acquire` reads the runner's
 * lease row locked, decides, and writes the new holder before any other hello of that runner — on this
 * instance or another — is decided. How live the row's lease is:
 * - held by a connection of this instance: from that connection's last word, exactly as above;
 * - held elsewhere (another instance, or this Server before a restart): until the row's expiry. The
 *   holding instance rewrites that expiry on every `persist()` (each heartbeat interval, and at
 *   shutdown) as last heard + `timeoutMs` + `slackMs`; the slack (one heartbeat interval) covers the time
 *   until the next rewrite, so the row never reads dead while its holder is alive.
 */
import { randomBytes, timingSafeEqual } from "node:crypto";
import { hashSecret, type LeaseRow, type LeaseStore, MemoryLeaseStore } from "./lease-store.js";

export interface LeaseHolder {
  readonly closed: boolean;
  /** Date.now() of the last frame or pong from this connection. */
  readonly lastHeardAt: number;
}

interface Lease {
  secret: string;
  /** sha256 of `secret` (what the LeaseStore keeps), computed once when the lease is held. */
  secretHash: Buffer;
  holder: LeaseHolder;
  /** The holder's id in the store's `holder` column (unique across instances). */
  holderId: string;
  /** lastHeardAt of the holder when its socket closed; null while it is open. */
  closedHeardAt: number | null;
}

export type LeaseDecision = { kind: "grant" } | { kind: "resume" } | { kind: "refuse"; liveForMs: number };

/** What `acquire` decided; a grant or resume carries the secret for `hello.ack`. */
export type LeaseAcquired =
  | { kind: "grant"; secret: string }
  | { kind: "resume"; secret: string }
  | { kind: "refuse"; liveForMs: number };

function sameHash(a: Buffer, b: Buffer): boolean {
  return a.byteLength === b.byteLength && timingSafeEqual(a, b);
}

export class LinkLeases {
  /** The leases held by this instance's connections. */
  readonly #leases = new Map<string, Lease>();
  readonly #store: LeaseStore;
  #holders = 0;

  /**
   * `instanceId` names this Server instance in the store's `holder` column (unique per process);
   * `slackMs` is how much longer than `timeoutMs` a written-down expiry lasts (see the header).
   */
  constructor(
    readonly timeoutMs: number,
    private readonly now: () => number = Date.now,
    store?: LeaseStore,
    private readonly instanceId: string = randomBytes(12).toString("base64url"),
    private readonly slackMs = 0,
  ) {
    this.#store = store ?? new MemoryLeaseStore();
  }

  /** Milliseconds a lease of this instance stays live without news from its holder; 0 when dead. */
  #liveFor(lease: Lease): number {
    const heard = lease.closedHeardAt ?? lease.holder.lastHeardAt;
    return Math.max(0, heard + this.timeoutMs - this.now());
  }

  /** How the row decides a hello that presents `presented` (see the table in the header). */
  #decide(row: LeaseRow | undefined, local: Lease | undefined, presented: string | undefined): LeaseDecision {
    if (row === undefined) return { kind: "grant" };
    const liveForMs =
      local !== undefined && local.holderId === row.holder
        ? this.#liveFor(local)
        : Math.max(0, row.expiresAtMs - this.now());
    if (liveForMs === 0) return { kind: "grant" };
    if (presented !== undefined && sameHash(hashSecret(presented), row.secretHash)) return { kind: "resume" };
    return { kind: "refuse", liveForMs };
  }

  /**
   * Decide a hello of `runnerId` from `holder` presenting `presented`, and on a grant or resume make
   * `holder` the lease holder — one transaction in the store (see the header). A grant mints a new
   * secret; a resume keeps the current one (the one presented, which hashes to the row's).
   * Rejects with the store's error (e.g. StateUnavailableError): nothing was decided.
   */
  async acquire(runnerId: string, holder: LeaseHolder, presented: string | undefined): Promise<LeaseAcquired> {
    const holderId = `${this.instanceId}/${++this.#holders}`;
    const before = this.#leases.get(runnerId);
    const mine: { taken: Lease | null } = { taken: null };
    try {
      return await this.#store.decide<LeaseAcquired>(runnerId, (row) => {
        const decision = this.#decide(row, this.#leases.get(runnerId), presented);
        if (decision.kind === "refuse") return { write: null, result: decision };
        const secret = decision.kind === "resume" ? (presented as string) : randomBytes(32).toString("base64url");
        const secretHash = decision.kind === "resume" && row ? row.secretHash : hashSecret(secret);
        // Taken here, inside the transaction, so the next decision on this instance already sees it.
        const taken: Lease = { secret, secretHash, holder, holderId, closedHeardAt: null };
        mine.taken = taken;
        this.#leases.set(runnerId, taken);
        const expiresAtMs = holder.lastHeardAt + this.timeoutMs + this.slackMs;
        return { write: { secretHash, expiresAtMs, holder: holderId }, result: { kind: decision.kind, secret } };
      });
    } catch (err) {
      // Not committed: the lease this instance had (if any) stands.
      if (mine.taken !== null && this.#leases.get(runnerId) === mine.taken) {
        if (before === undefined) this.#leases.delete(runnerId);
        else this.#leases.set(runnerId, before);
      }
      throw err;
    }
  }

  /** The lease id (`<instance id>/<link number>`, the store's `holder`) `holder` holds for `runnerId`, if any. */
  holderIdOf(runnerId: string, holder: LeaseHolder): string | undefined {
    const lease = this.#leases.get(runnerId);
    return lease?.holder === holder ? lease.holderId : undefined;
  }

  /**
   * Write every live lease's current expiry to the store (each heartbeat interval, and at shutdown).
   * Resolves to the runner ids whose lease another holder took meanwhile (another instance decided it
   * dead, or the Runner resumed there): this instance no longer holds them and forgets them.
   */
  async persist(): Promise<string[]> {
    const entries: { runnerId: string; holder: string; expiresAtMs: number }[] = [];
    const held = new Map<string, Lease>();
    for (const [runnerId, lease] of this.#leases) {
      if (this.#liveFor(lease) === 0) continue;
      const heard = lease.closedHeardAt ?? lease.holder.lastHeardAt;
      entries.push({ runnerId, holder: lease.holderId, expiresAtMs: heard + this.timeoutMs + this.slackMs });
      held.set(runnerId, lease);
    }
    const lost = await this.#store.extend(entries);
    for (const runnerId of lost) {
      if (this.#leases.get(runnerId) === held.get(runnerId)) this.#leases.delete(runnerId);
    }
    return lost;
  }

  /** The holder's socket closed. Clean (the Runner stopping): the lease ends; otherwise it runs out. */
  async closed(runnerId: string, holder: LeaseHolder, clean: boolean): Promise<void> {
    const lease = this.#leases.get(runnerId);
    if (!lease || lease.holder !== holder) return;
    if (clean) {
      this.#leases.delete(runnerId);
      await this.#store.end(runnerId, lease.holderId);
    } else lease.closedHeardAt = holder.lastHeardAt;
  }

  /** End a runner's lease now if this instance holds it (its token was rotated). */
  async release(runnerId: string): Promise<void> {
    const lease = this.#leases.get(runnerId);
    if (!lease) return;
    this.#leases.delete(runnerId);
    await this.#store.end(runnerId, lease.holderId);
  }
}
