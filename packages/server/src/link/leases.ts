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
 * With a LeaseStore (the state DB, link/lease-store.ts) each lease is also written down — runner id,
 * sha256 of the secret, expiry — when it is granted or resumed, on every `persist()` (the hub calls it
 * each heartbeat interval and at shutdown) and when it ends. A restarted Server with no lease in memory
 * consults that row: until it expires, only a hello whose secret hashes to it gets in (resumed); any
 * other is refused. So a Server restart does not open a window in which a token holder can race the
 * real Runner for its link.
 */
import { randomBytes, timingSafeEqual } from "node:crypto";
import { hashSecret, type LeaseStore } from "./lease-store.js";

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
  /** lastHeardAt of the holder when its socket closed; null while it is open. */
  closedHeardAt: number | null;
}

export type LeaseDecision = { kind: "grant" } | { kind: "resume" } | { kind: "refuse"; liveForMs: number };

function sameSecret(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.byteLength === y.byteLength && timingSafeEqual(x, y);
}

export class LinkLeases {
  readonly #leases = new Map<string, Lease>();

  constructor(
    readonly timeoutMs: number,
    private readonly now: () => number = Date.now,
    private readonly store?: LeaseStore,
  ) {}

  /** Milliseconds the lease of `runnerId` stays live without news from its holder; 0 when dead or absent. */
  #liveFor(lease: Lease): number {
    const heard = lease.closedHeardAt ?? lease.holder.lastHeardAt;
    return Math.max(0, heard + this.timeoutMs - this.now());
  }

  decide(runnerId: string, presented: string | undefined): LeaseDecision {
    const lease = this.#leases.get(runnerId);
    if (!lease) return this.#decidePersisted(runnerId, presented);
    const liveForMs = this.#liveFor(lease);
    if (liveForMs === 0) return { kind: "grant" };
    if (presented !== undefined && sameSecret(presented, lease.secret)) return { kind: "resume" };
    return { kind: "refuse", liveForMs };
  }

  /** No lease in memory (a restarted Server): the written-down one decides until it expires. */
  #decidePersisted(runnerId: string, presented: string | undefined): LeaseDecision {
    const row = this.store?.get(runnerId);
    const liveForMs = row ? Math.max(0, row.expiresAtMs - this.now()) : 0;
    if (!row || liveForMs === 0) return { kind: "grant" };
    if (
      presented !== undefined &&
      row.secretHash.byteLength === 32 &&
      timingSafeEqual(hashSecret(presented), row.secretHash)
    )
      return { kind: "resume" };
    return { kind: "refuse", liveForMs };
  }

  /**
   * Make `holder` the lease holder; a grant mints a new secret, a resume keeps the current one (after a
   * Server restart: the one the holder presented, which matched the written-down hash).
   */
  hold(runnerId: string, holder: LeaseHolder, decision: "grant" | "resume", presented?: string): string {
    const current = this.#leases.get(runnerId);
    const kept = decision === "resume" ? (current?.secret ?? presented) : undefined;
    const secret = kept ?? randomBytes(32).toString("base64url");
    const secretHash = hashSecret(secret);
    this.#leases.set(runnerId, { secret, secretHash, holder, closedHeardAt: null });
    this.store?.save([{ runnerId, secretHash, expiresAtMs: holder.lastHeardAt + this.timeoutMs }]);
    return secret;
  }

  /** Write every live lease's current expiry to the store (each heartbeat interval, and at shutdown). */
  persist(): void {
    if (!this.store) return;
    const entries = [];
    for (const [runnerId, lease] of this.#leases) {
      if (this.#liveFor(lease) === 0) continue;
      const heard = lease.closedHeardAt ?? lease.holder.lastHeardAt;
      entries.push({ runnerId, secretHash: lease.secretHash, expiresAtMs: heard + this.timeoutMs });
    }
    this.store.save(entries);
  }

  /** The holder's socket closed. Clean (the Runner stopping): the lease ends; otherwise it runs out. */
  closed(runnerId: string, holder: LeaseHolder, clean: boolean): void {
    const lease = this.#leases.get(runnerId);
    if (!lease || lease.holder !== holder) return;
    if (clean) {
      this.#leases.delete(runnerId);
      this.store?.delete(runnerId);
    } else lease.closedHeardAt = holder.lastHeardAt;
  }

  /** End a runner's lease now (its token was rotated). */
  release(runnerId: string): void {
    this.#leases.delete(runnerId);
    this.store?.delete(runnerId);
  }
}
