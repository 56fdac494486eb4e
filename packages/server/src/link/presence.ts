/**
 * Runner presence in the state DB (table `runner_presence`): per runner id, whether a hello-completed link is
 * live, since when, and what that hello advertised (protocol version, projects, providers, capacity,
 * `agents_share_runner_user`). The Registry writes it on every accepted hello and every end of the live link,
 * so readers that are not the process holding the link (the operator console, another instance sharing the
 * database) see the fleet, and another instance can route a start to it (cluster/directory.ts: the store id and
 * the providers' instance ids and config option names, schema step 13). Ids, names and option names only: the
 * hello carries no paths, and none are written here.
 *
 * A row says online only while its Server keeps it fresh: the Server holding the links rewrites `seen_ms` of its
 * live runners every PRESENCE_REFRESH_MS (server.ts), and a reader counts a row not refreshed for
 * PRESENCE_STALE_MS as offline since it was last seen — so a Server that died without a word, or an instance
 * that shares the database, does not leave its Runners shown online.
 *
 * Writes are queued in order (an end of a link never overtakes its start) and never fail the caller: a
 * failed one is reported to `onError`. The table is schema step 10.
 */
import type { StateEngine } from "../state/engine.js";

/** How often the Server holding the links marks its live runners as still there. */
export const PRESENCE_REFRESH_MS = 5_000;
/** A row not refreshed for this long reads as offline (three missed refreshes). */
export const PRESENCE_STALE_MS = 3 * PRESENCE_REFRESH_MS;

/** Presence writes waiting for the database (a slow one); beyond this a write is dropped and reported. */
export const PRESENCE_MAX_PENDING = 1024;

export interface PresenceOnline {
  runner_id: string;
  protocol_version: number;
  agent_instance_id: string;
  /** The Runner's store id (a start's store fence, read by other instances: cluster/directory.ts). */
  store_id: string;
  projects: readonly { project_id: string; allow_patch: boolean }[];
  /** What the hello advertised per provider; the view columns keep id and name, `provider_adverts` all of it. */
  providers: readonly {
    provider_id: string;
    name: string;
    provider_instance_id: string;
    allowed_config_options: readonly string[];
  }[];
  max_concurrent_runs: number;
  agents_share_runner_user: boolean | null;
  /** The Runner's software version from its hello; null when it did not say. */
  runner_version: string | null;
}

export interface PresenceRow {
  runner_id: string;
  online: number;
  since: string;
  protocol_version: number | null;
  agent_instance_id: string | null;
  /** JSON array of {project_id, allow_patch}. */
  projects: string;
  /** JSON array of {provider_id, name}. */
  providers: string;
  max_concurrent_runs: number | null;
  agents_share_runner_user: number | null;
  /** When the holding Server last said this runner is live (epoch ms). */
  seen_ms: number;
  /** The Runner's software version from its hello (schema step 14; null when it did not say). */
  runner_version: string | null;
  /** The hello's store id (schema step 13; null in a row written before it). */
  store_id: string | null;
  /** JSON array of the hello's provider adverts, with their instance ids and config options (step 13). */
  provider_adverts: string;
}

/** Whether a row stands for a live link now, and since when it is (or was last seen) online or offline. */
export function presenceAt(row: PresenceRow, nowMs: number): { online: boolean; since: string } {
  if (row.online !== 1) return { online: false, since: row.since };
  if (nowMs - row.seen_ms < PRESENCE_STALE_MS) return { online: true, since: row.since };
  return { online: false, since: new Date(row.seen_ms).toISOString() };
}

export class PresenceStore {
  readonly #db: StateEngine;
  /** Writes in the order they were made (an offline after its online), one at a time. */
  #queue: Promise<void> = Promise.resolve();
  #pending = 0;

  /**
   * A failed write is reported to `onError`: presence is a view, never a reason to refuse a Runner.
   * `db` must be migrated (state/schema.ts step 10).
   */
  constructor(
    db: StateEngine,
    private readonly onError: (err: unknown) => void = () => {},
  ) {
    this.#db = db;
  }

  /** Queue one write after the earlier ones; resolves when it is done (or failed and was reported). */
  #write(work: () => Promise<unknown>): Promise<void> {
    if (this.#pending >= PRESENCE_MAX_PENDING) {
      this.onError(new Error(`${this.#pending} presence writes already wait (PRESENCE_MAX_PENDING); one is dropped`));
      return Promise.resolve();
    }
    this.#pending += 1;
    const done = this.#queue
      .then(work)
      .then(
        () => undefined,
        (err: unknown) => this.onError(err),
      )
      .finally(() => {
        this.#pending -= 1;
      });
    this.#queue = done;
    return done;
  }

  online(p: PresenceOnline, at = new Date()): Promise<void> {
    const params = [
      p.runner_id,
      at.toISOString(),
      p.protocol_version,
      p.agent_instance_id,
      JSON.stringify(p.projects.map((x) => ({ project_id: x.project_id, allow_patch: x.allow_patch }))),
      JSON.stringify(p.providers.map((x) => ({ provider_id: x.provider_id, name: x.name }))),
      p.max_concurrent_runs,
      p.agents_share_runner_user === null ? null : p.agents_share_runner_user ? 1 : 0,
      at.getTime(),
      p.runner_version,
      p.store_id,
      JSON.stringify(
        p.providers.map((x) => ({
          provider_id: x.provider_id,
          provider_instance_id: x.provider_instance_id,
          name: x.name,
          allowed_config_options: [...x.allowed_config_options],
        })),
      ),
    ];
    return this.#write(() =>
      this.#db.run(
        `INSERT INTO runner_presence (runner_id, online, since, protocol_version, agent_instance_id, projects, providers,
           max_concurrent_runs, agents_share_runner_user, seen_ms, runner_version, store_id, provider_adverts)
         VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (runner_id) DO UPDATE SET online = 1, since = excluded.since,
           protocol_version = excluded.protocol_version, agent_instance_id = excluded.agent_instance_id,
           projects = excluded.projects, providers = excluded.providers, max_concurrent_runs = excluded.max_concurrent_runs,
           agents_share_runner_user = excluded.agents_share_runner_user, seen_ms = excluded.seen_ms,
           runner_version = excluded.runner_version, store_id = excluded.store_id,
           provider_adverts = excluded.provider_adverts`,
        params,
      ),
    );
  }

  /**
   * The live link that went online at `onlineSince` (its `online` write's time) ended. Only that one: when
   * the Runner's link is already live again elsewhere (another instance took it over and wrote its own
   * `since`), the row stays online. Without `onlineSince`, whichever link the row describes ends.
   */
  offline(runnerId: string, at = new Date(), onlineSince?: Date): Promise<void> {
    return this.#write(() =>
      onlineSince === undefined
        ? this.#db.run("UPDATE runner_presence SET online = 0, since = ? WHERE runner_id = ? AND online = 1", [
            at.toISOString(),
            runnerId,
          ])
        : this.#db.run(
            "UPDATE runner_presence SET online = 0, since = ? WHERE runner_id = ? AND online = 1 AND since = ?",
            [at.toISOString(), runnerId, onlineSince.toISOString()],
          ),
    );
  }

  /** The runners whose links this Server holds are still there (one transaction). */
  seen(runnerIds: readonly string[], nowMs = Date.now()): Promise<void> {
    if (runnerIds.length === 0) return Promise.resolve();
    const ids = [...runnerIds];
    return this.#write(() =>
      this.#db.transaction(async (tx) => {
        for (const id of ids) {
          await tx.run("UPDATE runner_presence SET seen_ms = ? WHERE runner_id = ? AND online = 1", [nowMs, id]);
        }
      }),
    );
  }

  async rows(): Promise<PresenceRow[]> {
    return await this.#db.all<PresenceRow>("SELECT * FROM runner_presence ORDER BY runner_id");
  }
}
