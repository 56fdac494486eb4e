/**
 * Which Runners are connected and what they advertise. A project id resolves
 * to exactly one configured runner (the Server config's binding); whether
 * that runner is online, and with which instance ids, comes from its live
 * `hello`.
 */
import type { HelloFrame, ProjectAdvert, ProviderAdvert } from "@webcodex/protocol";
import type { ServerConfig } from "../config.js";
import type { RunnerConnection } from "./hub.js";
import type { PresenceStore } from "./presence.js";

export interface LiveRunner {
  runnerId: string;
  conn: RunnerConnection;
  agentInstanceId: string;
  storeId: string;
  providers: readonly ProviderAdvert[];
  projects: readonly ProjectAdvert[];
  maxConcurrentRuns: number;
  connectedAt: string;
  /** The hello's `agents_share_runner_user`; null when the Runner did not say (it predates the field). */
  agentsShareRunnerUser: boolean | null;
}

export type ProjectResolution =
  | { kind: "unknown_project" }
  | { kind: "runner_offline"; runnerId: string }
  | { kind: "not_advertised"; runner: LiveRunner }
  | { kind: "ok"; runner: LiveRunner; project: ProjectAdvert };

export class Registry {
  readonly #live = new Map<string, LiveRunner>();

  /** `presence`: where accepted hellos and ends of live links are written for other readers (link/presence.ts). */
  constructor(
    private readonly config: ServerConfig,
    private readonly presence?: PresenceStore,
  ) {}

  /** Record a hello (the hub already checked that the projects are bound to this runner). */
  connected(conn: RunnerConnection, hello: HelloFrame): LiveRunner {
    const connectedAt = new Date();
    const live: LiveRunner = {
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

  live(runnerId: string): LiveRunner | undefined {
    const r = this.#live.get(runnerId);
    return r && !r.conn.closed ? r : undefined;
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

  resolveProject(projectId: string): ProjectResolution {
    const runnerId = this.config.projectRunner.get(projectId);
    if (runnerId === undefined) return { kind: "unknown_project" };
    const runner = this.live(runnerId);
    if (!runner) return { kind: "runner_offline", runnerId };
    const project = runner.projects.find((p) => p.project_id === projectId);
    if (!project) return { kind: "not_advertised", runner };
    return { kind: "ok", runner, project };
  }
}
