/**
 * Runner presence in the state DB (table `runner_presence`): per runner id, whether a hello-completed link is
 * live, since when, and what that hello advertised (protocol version, projects, providers, capacity,
 * `agents_share_runner_user`). The Registry writes it on every accepted hello and every end of the live link,
 * so readers that are not the process holding the link (the operator console, another instance sharing the
 * database) see the fleet. Provider and project ids and names only: the hello carries no paths, and none are
 * written here.
 *
 * A row says online only while its Server keeps it fresh: the Server holding the links rewrites `seen_ms` of its
 * live runners every PRESENCE_REFRESH_MS (server.ts), and a reader counts a row not refreshed for
 * PRESENCE_STALE_MS as offline since it was last seen — so a Server that died without a word, or an instance
 * that shares the database, does not leave its Runners shown online.
 *
 * Additive: the table creates itself (like principal_tokens), so it needs no schema step.
 */
import type BetterSqlite3 from "better-sqlite3";

/** How often the Server holding the links marks its live runners as still there. */
export const PRESENCE_REFRESH_MS = 5_000;
/** A row not refreshed for this long reads as offline (three missed refreshes). */
export const PRESENCE_STALE_MS = 3 * PRESENCE_REFRESH_MS;

const SCHEMA = `
CREATE TABLE IF NOT EXISTS runner_presence (
  runner_id TEXT PRIMARY KEY,
  online INTEGER NOT NULL,
  since TEXT NOT NULL,
  protocol_version INTEGER,
  agent_instance_id TEXT,
  projects TEXT NOT NULL DEFAULT '[]',
  providers TEXT NOT NULL DEFAULT '[]',
  max_concurrent_runs INTEGER,
  agents_share_runner_user INTEGER,
  seen_ms INTEGER NOT NULL DEFAULT 0
);
`;

export interface PresenceOnline {
  runner_id: string;
  protocol_version: number;
  agent_instance_id: string;
  projects: readonly { project_id: string; allow_patch: boolean }[];
  providers: readonly { provider_id: string; name: string }[];
  max_concurrent_runs: number;
  agents_share_runner_user: boolean | null;
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
}

/** Whether a row stands for a live link now, and since when it is (or was last seen) online or offline. */
export function presenceAt(row: PresenceRow, nowMs: number): { online: boolean; since: string } {
  if (row.online !== 1) return { online: false, since: row.since };
  if (nowMs - row.seen_ms < PRESENCE_STALE_MS) return { online: true, since: row.since };
  return { online: false, since: new Date(row.seen_ms).toISOString() };
}

export class PresenceStore {
  readonly #online: BetterSqlite3.Statement;
  readonly #offline: BetterSqlite3.Statement<[string, string]>;
  readonly #all: BetterSqlite3.Statement<[], PresenceRow>;
  readonly #seen: BetterSqlite3.Statement<[number, string]>;
  readonly #db: BetterSqlite3.Database;

  /** A failed write is reported to `onError`: presence is a view, never a reason to refuse a Runner. */
  constructor(
    db: BetterSqlite3.Database,
    private readonly onError: (err: unknown) => void = () => {},
  ) {
    db.exec(SCHEMA);
    this.#db = db;
    this.#online = db.prepare(
      `INSERT INTO runner_presence (runner_id, online, since, protocol_version, agent_instance_id, projects, providers,
         max_concurrent_runs, agents_share_runner_user, seen_ms)
       VALUES (@runner_id, 1, @since, @protocol_version, @agent_instance_id, @projects, @providers, @max_concurrent_runs,
         @agents_share_runner_user, @seen_ms)
       ON CONFLICT (runner_id) DO UPDATE SET online = 1, since = excluded.since,
         protocol_version = excluded.protocol_version, agent_instance_id = excluded.agent_instance_id,
         projects = excluded.projects, providers = excluded.providers, max_concurrent_runs = excluded.max_concurrent_runs,
         agents_share_runner_user = excluded.agents_share_runner_user, seen_ms = excluded.seen_ms`,
    );
    this.#seen = db.prepare<[number, string]>(
      "UPDATE runner_presence SET seen_ms = ? WHERE runner_id = ? AND online = 1",
    );
    this.#offline = db.prepare<[string, string]>(
      "UPDATE runner_presence SET online = 0, since = ? WHERE runner_id = ? AND online = 1",
    );
    this.#all = db.prepare<[], PresenceRow>("SELECT * FROM runner_presence ORDER BY runner_id");
  }

  online(p: PresenceOnline, at = new Date()): void {
    try {
      this.#online.run({
        runner_id: p.runner_id,
        since: at.toISOString(),
        protocol_version: p.protocol_version,
        agent_instance_id: p.agent_instance_id,
        projects: JSON.stringify(p.projects.map((x) => ({ project_id: x.project_id, allow_patch: x.allow_patch }))),
        providers: JSON.stringify(p.providers.map((x) => ({ provider_id: x.provider_id, name: x.name }))),
        max_concurrent_runs: p.max_concurrent_runs,
        agents_share_runner_user: p.agents_share_runner_user === null ? null : p.agents_share_runner_user ? 1 : 0,
        seen_ms: at.getTime(),
      });
    } catch (err) {
      this.onError(err);
    }
  }

  offline(runnerId: string, at = new Date()): void {
    try {
      this.#offline.run(at.toISOString(), runnerId);
    } catch (err) {
      this.onError(err);
    }
  }

  /** The runners whose links this Server holds are still there (one transaction). */
  seen(runnerIds: readonly string[], nowMs = Date.now()): void {
    if (runnerIds.length === 0) return;
    try {
      this.#db.transaction(() => {
        for (const id of runnerIds) this.#seen.run(nowMs, id);
      })();
    } catch (err) {
      this.onError(err);
    }
  }

  rows(): PresenceRow[] {
    return this.#all.all();
  }
}
