/**
 * The instance directory of a cluster on one PostgreSQL state (design §14): every instance writes its id and the
 * URL its peers reach it on (`server_instances`, schema step 13; `[server.cluster] advertise_url`, default the
 * instances' own listener) at start and every CLUSTER_HEARTBEAT_MS; a row not refreshed for
 * CLUSTER_INSTANCE_STALE_MS names no live instance. A Runner linked elsewhere is read from its presence row (what
 * its hello advertised, link/presence.ts), its lease row (which instance holds the link, link/lease-store.ts) and
 * that instance's directory row. The fences come from the hello the holder accepted; a view gone stale (the
 * Runner restarted meanwhile) makes the Runner refuse the start (`stale_runner`), never run it twice.
 */
import type { ProjectAdvert, ProviderAdvert } from "@webcodex/protocol";
import type { Logger } from "pino";
import { PRESENCE_STALE_MS } from "../link/presence.js";
import type { StateEngine } from "../state/engine.js";

/** How often an instance rewrites its directory row. */
export const CLUSTER_HEARTBEAT_MS = 5_000;
/** A directory row not rewritten for this long names no live instance (three missed heartbeats). */
export const CLUSTER_INSTANCE_STALE_MS = 3 * CLUSTER_HEARTBEAT_MS;

/** A Runner linked to another instance, as the shared rows show it. */
export interface RemoteRunnerView {
  runnerId: string;
  holderInstanceId: string;
  /** The lease row's holder: `<instance id>/<link number>`. */
  holderLease: string;
  holderUrl: string;
  agentInstanceId: string;
  storeId: string;
  providers: ProviderAdvert[];
  projects: ProjectAdvert[];
  maxConcurrentRuns: number;
  connectedAt: string;
  agentsShareRunnerUser: boolean | null;
}

interface ViewRow {
  online: number;
  since: string;
  seen_ms: number;
  agent_instance_id: string | null;
  store_id: string | null;
  provider_adverts: string;
  projects: string;
  max_concurrent_runs: number | null;
  agents_share_runner_user: number | null;
  holder: string;
  expires_ms: number;
  /** The holder's directory row (null: it has none). */
  peer_url: string | null;
  peer_heartbeat_at: number | null;
}

/** This instance's directory row, and the reads of the other instances' rows. */
export class ClusterDirectory {
  #timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly db: StateEngine,
    readonly instanceId: string,
    readonly url: string,
    private readonly log: Logger,
  ) {}

  /** Write this instance's row now (throws when the database cannot take it) and then every heartbeat. */
  async start(): Promise<void> {
    // A row at this instance's own URL under another id is an earlier process at this address (this one
    // holds the port now): it is dead, however fresh its last heartbeat.
    await this.db.run("DELETE FROM server_instances WHERE url = ? AND instance_id <> ?", [this.url, this.instanceId]);
    await this.#beat();
    this.#timer = setInterval(() => {
      this.#beat().catch((err: unknown) =>
        this.log.error({ err: (err as Error).message }, "cluster directory row not refreshed (state DB)"),
      );
    }, CLUSTER_HEARTBEAT_MS);
    this.#timer.unref();
  }

  async #beat(): Promise<void> {
    await this.db.run(
      `INSERT INTO server_instances (instance_id, url, heartbeat_at) VALUES (?, ?, ?)
       ON CONFLICT (instance_id) DO UPDATE SET url = excluded.url, heartbeat_at = excluded.heartbeat_at`,
      [this.instanceId, this.url, Date.now()],
    );
  }

  /** Stop the heartbeat and remove this instance's row (a clean stop; a killed one's row goes stale). */
  async stop(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
    await this.db.run("DELETE FROM server_instances WHERE instance_id = ?", [this.instanceId]).catch(() => undefined);
  }

  /**
   * The Runner `runnerId` as linked to ANOTHER live instance, or undefined: its presence row says online and
   * fresh, its lease is unexpired and held by an instance other than this one, and that instance's
   * directory row is fresh and not at this instance's own URL.
   */
  async remoteRunner(runnerId: string, nowMs = Date.now()): Promise<RemoteRunnerView | undefined> {
    // One read: the holder's directory row joins on the lease's holder (`<instance id>/<connection>`).
    const row = await this.db.get<ViewRow>(
      `SELECT p.online, p.since, p.seen_ms, p.agent_instance_id, p.store_id, p.provider_adverts, p.projects,
              p.max_concurrent_runs, p.agents_share_runner_user, l.holder, l.expires_ms,
              i.url AS peer_url, i.heartbeat_at AS peer_heartbeat_at
         FROM runner_presence p JOIN runner_link_leases l ON l.runner_id = p.runner_id
         LEFT JOIN server_instances i ON substr(l.holder, 1, length(i.instance_id) + 1) = i.instance_id || '/'
        WHERE p.runner_id = ?`,
      [runnerId],
    );
    if (row?.online !== 1 || nowMs - Number(row.seen_ms) >= PRESENCE_STALE_MS) return undefined;
    if (Number(row.expires_ms) <= nowMs || row.agent_instance_id === null || row.store_id === null) return undefined;
    const holderInstanceId = row.holder.split("/")[0] ?? "";
    if (holderInstanceId === "" || holderInstanceId === this.instanceId) return undefined;
    // A holder at this instance's own URL is an earlier process at this address (killed, then this one
    // started): its link died with it, however fresh its rows.
    if (
      row.peer_url === null ||
      row.peer_url === this.url ||
      nowMs - Number(row.peer_heartbeat_at) >= CLUSTER_INSTANCE_STALE_MS
    ) {
      return undefined;
    }
    const peer = { url: row.peer_url };
    let providers: ProviderAdvert[];
    let projects: ProjectAdvert[];
    try {
      providers = JSON.parse(row.provider_adverts) as ProviderAdvert[];
      projects = JSON.parse(row.projects) as ProjectAdvert[];
    } catch {
      return undefined;
    }
    return {
      runnerId,
      holderInstanceId,
      holderLease: row.holder,
      holderUrl: peer.url,
      agentInstanceId: row.agent_instance_id,
      storeId: row.store_id,
      providers,
      projects,
      maxConcurrentRuns: row.max_concurrent_runs ?? 1,
      connectedAt: row.since,
      agentsShareRunnerUser: row.agents_share_runner_user === null ? null : row.agents_share_runner_user === 1,
    };
  }
}
