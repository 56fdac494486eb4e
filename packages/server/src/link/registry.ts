/**
 * Which Runners are connected and what they advertise. A project id resolves
 * to exactly one configured runner (the Server config's binding); whether
 * that runner is online, and with which instance ids, comes from its live
 * `hello` — on this instance (`live`), or on another instance sharing the
 * PostgreSQL state (`lookup`, through the `RemoteLookup` the cluster gives it,
 * cluster/remote-runner.ts: the holder's hello as its presence row shows it,
 * requests forwarded to the holder).
 */
import type { HelloFrame, ProjectAdvert, ProviderAdvert } from "@webcodex/protocol";
import type { ServerConfig } from "../config.js";
import type { RequestOutcome, RunnerConnection, RunnerRequest } from "./hub.js";
import type { PresenceStore } from "./presence.js";

/** What a link to a Runner does, whichever instance holds it (hub.ts RunnerConnection, or the holder's). */
export interface LinkConnection {
  readonly runnerId: string;
  readonly closed: boolean;
  request(req: RunnerRequest, timeoutMs?: number): Promise<RequestOutcome>;
}

export interface LiveRunner {
  runnerId: string;
  /** This instance's link (a RunnerConnection), or the holder's reached through it (RemoteRunnerConnection). */
  conn: LinkConnection;
  agentInstanceId: string;
  storeId: string;
  providers: readonly ProviderAdvert[];
  projects: readonly ProjectAdvert[];
  maxConcurrentRuns: number;
  connectedAt: string;
  /** The hello's `agents_share_runner_user`; null when the Runner did not say (it predates the field). */
  agentsShareRunnerUser: boolean | null;
}

/** A Runner whose link this instance holds. */
export interface LocalRunner extends LiveRunner {
  conn: RunnerConnection;
}

/** A link held by another instance, reached through it (cluster/remote-runner.ts RemoteRunnerConnection). */
export interface RemoteLink extends LinkConnection {
  /** Set when a request through this view found the holder without that Runner (answered not_sent). */
  readonly missed: boolean;
}

/** A Runner linked to another instance, as the shared rows show it. */
export interface RemoteRunner extends LiveRunner {
  conn: RemoteLink;
}

/** How this instance finds a Runner linked to another instance (PostgreSQL state only); undefined: none is. */
export type RemoteLookup = (runnerId: string) => Promise<RemoteRunner | undefined>;

export type ProjectResolution =
  | { kind: "unknown_project" }
  | { kind: "runner_offline"; runnerId: string }
  | { kind: "not_advertised"; runner: LiveRunner }
  | { kind: "ok"; runner: LiveRunner; project: ProjectAdvert };

/**
 * How long `lookupRecent` reuses a remote view of a Runner (observe and its catch-ups only), and for how
 * many Runners at most. A view's forwarded run.sync names the agent instance it expects, which the holder
 * checks, so a view gone stale within this time makes a catch-up fail — never mix two instances' events.
 */
export const REMOTE_VIEW_REUSE_MS = 1_000;
export const REMOTE_VIEW_MAX_ENTRIES = 16_384;

export class Registry {
  readonly #live = new Map<string, LocalRunner>();
  #remote: RemoteLookup | null = null;
  readonly #recent = new Map<string, { runner: RemoteRunner; at: number }>();
  /** `lookupRecent`'s reads of a remote view in flight, by runner id (at most one per Runner). */
  readonly #viewing = new Map<string, Promise<RemoteRunner | undefined>>();

  /** `presence`: where accepted hellos and ends of live links are written for other readers (link/presence.ts). */
  constructor(
    private readonly config: ServerConfig,
    private readonly presence?: PresenceStore,
  ) {}

  /** From now on `lookup` also finds Runners linked to other instances (cluster/node.ts, PostgreSQL state). */
  joinCluster(remote: RemoteLookup): void {
    this.#remote = remote;
  }

  /** Record a hello (the hub already checked that the projects are bound to this runner). */
  connected(conn: RunnerConnection, hello: HelloFrame): LocalRunner {
    const connectedAt = new Date();
    const live: LocalRunner = {
      runnerId: conn.runnerId,
      conn,
      agentInstanceId: hello.agent_instance_id,
      storeId: hello.store_id,
      providers: hello.providers,
      projects: hello.projects,
      maxConcurrentRuns: hello.capabilities.coding_agent_run.max_concurrent_runs,
      connectedAt: connectedAt.toISOString(),
      agentsShareRunnerUser: hello.agents_share_runner_user ?? null,
    };
    this.#live.set(conn.runnerId, live);
    // Queued in order with the link's end, failures reported by the store: never awaited on the hello path.
    void this.presence?.online(
      {
        runner_id: conn.runnerId,
        protocol_version: hello.protocol_version,
        agent_instance_id: hello.agent_instance_id,
        store_id: hello.store_id,
        projects: hello.projects,
        providers: hello.providers,
        max_concurrent_runs: live.maxConcurrentRuns,
        agents_share_runner_user: live.agentsShareRunnerUser,
        runner_version: hello.runner_version ?? null,
      },
      connectedAt,
    );
    return live;
  }

  disconnected(conn: RunnerConnection): void {
    const live = this.#live.get(conn.runnerId);
    if (live?.conn !== conn) return;
    this.#live.delete(conn.runnerId);
    // Only the link this instance wrote online: another instance may hold the Runner's link by now.
    void this.presence?.offline(conn.runnerId, new Date(), new Date(live.connectedAt));
  }

  /** Ids of the runners with a live link here. */
  liveIds(): string[] {
    return [...this.#live.values()].filter((r) => !r.conn.closed).map((r) => r.runnerId);
  }

  /** The Runner, if its link is on THIS instance (the hub's side: run.update, hellos, forwarded requests). */
  live(runnerId: string): LocalRunner | undefined {
    const r = this.#live.get(runnerId);
    return r && !r.conn.closed ? r : undefined;
  }

  /**
   * The Runner wherever its one live link is: this instance's, else (on a shared PostgreSQL state) the
   * instance holding it, with a connection that forwards requests there. Undefined when offline.
   */
  async lookup(runnerId: string): Promise<LiveRunner | undefined> {
    const local = this.live(runnerId);
    const remote = this.#remote;
    if (local || remote === null) return local;
    return await remote(runnerId);
  }

  /**
   * Like `lookup`, for what only reads the Runner (observe's catch-ups): a remote view read less than
   * REMOTE_VIEW_REUSE_MS ago is used again, when it names the agent instance `instance` (the mirror's; null:
   * always read again) and no request through it found the holder without that Runner since.
   */
  async lookupRecent(runnerId: string, instance: string | null): Promise<LiveRunner | undefined> {
    const local = this.live(runnerId);
    const remote = this.#remote;
    if (local || remote === null) return local;
    const now = Date.now();
    const recent = this.#recent.get(runnerId);
    if (
      recent !== undefined &&
      now - recent.at < REMOTE_VIEW_REUSE_MS &&
      recent.runner.agentInstanceId === instance &&
      !recent.runner.conn.missed
    ) {
      return recent.runner;
    }
    this.#recent.delete(runnerId);
    // Lookups of one Runner while its view is being read share that read.
    let reading = this.#viewing.get(runnerId);
    if (reading === undefined) {
      const read = remote(runnerId).finally(() => {
        if (this.#viewing.get(runnerId) === read) this.#viewing.delete(runnerId);
      });
      reading = read;
      this.#viewing.set(runnerId, read);
    }
    const runner = await reading;
    if (runner === undefined) return undefined;
    if (this.#recent.size >= REMOTE_VIEW_MAX_ENTRIES) {
      const oldest = this.#recent.keys().next().value;
      if (oldest !== undefined) this.#recent.delete(oldest);
    }
    this.#recent.set(runnerId, { runner, at: now });
    return runner;
  }

  /**
   * Whether runs of `principalId` may go to `runner`: always, unless its Server config lists
   * `shared_user_principals` and its agents share its OS user (its hello says so, or says nothing) — then
   * only the listed principals' may (design §4.2: such an agent can read the Runner's token).
   */
  servesPrincipal(runner: LiveRunner, principalId: string): boolean {
    const listed = this.config.runners.find((r) => r.id === runner.runnerId)?.sharedUserPrincipals ?? null;
    if (listed === null || runner.agentsShareRunnerUser === false) return true;
    return listed.has(principalId);
  }

  runnerForProject(projectId: string): string | undefined {
    return this.config.projectRunner.get(projectId);
  }

  async resolveProject(projectId: string): Promise<ProjectResolution> {
    const runnerId = this.config.projectRunner.get(projectId);
    if (runnerId === undefined) return { kind: "unknown_project" };
    const runner = await this.lookup(runnerId);
    if (!runner) return { kind: "runner_offline", runnerId };
    const project = runner.projects.find((p) => p.project_id === projectId);
    if (!project) return { kind: "not_advertised", runner };
    return { kind: "ok", runner, project };
  }
}
