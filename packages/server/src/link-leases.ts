/**
 * "A live link is never silently replaced" (DESIGN §5). The Server holds one lease per runner id: the
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
 * (a Runner stopping) or its token is rotated. Leases live in memory: a restarted Server grants the
 * first hello.
 */
import { randomBytes, timingSafeEqual } from "node:crypto";

export interface LeaseHolder {
  readonly closed: boolean;
  /** Date.now() of the last frame or pong from this connection. */
  readonly lastHeardAt: number;
}

interface Lease {
  secret: string;
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
  ) {}

  /** Milliseconds the lease of `runnerId` stays live without news from its holder; 0 when dead or absent. */
  #liveFor(lease: Lease): number {
    const heard = lease.closedHeardAt ?? lease.holder.lastHeardAt;
    return Math.max(0, heard + this.timeoutMs - this.now());
  }

  decide(runnerId: string, presented: string | undefined): LeaseDecision {
    const lease = this.#leases.get(runnerId);
    if (!lease) return { kind: "grant" };
    const liveForMs = this.#liveFor(lease);
    if (liveForMs === 0) return { kind: "grant" };
    if (presented !== undefined && sameSecret(presented, lease.secret)) return { kind: "resume" };
    return { kind: "refuse", liveForMs };
  }

  /** Make `holder` the lease holder; a grant mints a new secret, a resume keeps the current one. */
  hold(runnerId: string, holder: LeaseHolder, decision: "grant" | "resume"): string {
    const current = this.#leases.get(runnerId);
    const secret = decision === "resume" && current ? current.secret : randomBytes(32).toString("base64url");
    this.#leases.set(runnerId, { secret, holder, closedHeardAt: null });
    return secret;
  }

  /** The holder's socket closed. Clean (the Runner stopping): the lease ends; otherwise it runs out. */
  closed(runnerId: string, holder: LeaseHolder, clean: boolean): void {
    const lease = this.#leases.get(runnerId);
    if (!lease || lease.holder !== holder) return;
    if (clean) this.#leases.delete(runnerId);
    else lease.closedHeardAt = holder.lastHeardAt;
  }

  /** End a runner's lease now (its token was rotated). */
  release(runnerId: string): void {
    this.#leases.delete(runnerId);
  }
}
