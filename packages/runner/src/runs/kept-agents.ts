/**
 * Warm follow-ups (design §17, `[acp] keep_agent_alive_secs`): the agent process of a run that ended normally,
 * with its ACP connection and session, kept for up to that many seconds so that a follow-up of that run
 * (`continue_run_id`) of the same caller, pool user, project, provider and cwd prompts the live session — no
 * spawn, no `initialize`, no `session/resume`/`session/load`.
 *
 * A kept agent is still its run's: its pool user stays leased to it, its process group stays recorded on the
 * run's dispatch row (so a Runner killed meanwhile has it reaped at start, and its pool user swept, like any
 * leftover: the follow-up then goes cold), and it holds no capacity slot a caller can see. It is stopped — the
 * run's tree ended, its row's child cleared, its pool user released and swept, exactly as a run's cleanup does
 * (`stop`, runs/settle.ts) — when its time ends, when the Runner stops, when a new run would need the slot
 * (`makeRoom`), or when it is found dead. At most MAX_KEPT_AGENTS are kept; past that a run's agent is not kept.
 * A run that is not a continuation never takes a kept agent: `take` is keyed by the parent run id.
 */
import type { NewSessionResponse } from "@agentclientprotocol/sdk";
import type { AcpClientConnection } from "../acp/session.js";
import type { AgentConfig, ProjectConfig } from "../config/config.js";
import type { RunAs } from "../config/run-as.js";
import type { Logger } from "../logger.js";
import type { AgentChild } from "../process/spawn.js";
import type { RunStartRequest } from "./service.js";

/** Most agent processes kept alive at once for a follow-up (each is a process and its pool user). */
export const MAX_KEPT_AGENTS = 4;

/** A kept agent: what the follow-up's turn takes over, and what it must match. */
export interface KeptAgent {
  /** The run whose agent this is (its dispatch row records the process group until the agent is taken or stopped). */
  readonly runId: string;
  readonly providerId: string;
  readonly projectId: string;
  /** The caller's tenant tag of the run (absent from older Servers and `exec`). */
  readonly tenant: string | undefined;
  readonly runAs: RunAs | null;
  readonly cwd: string;
  readonly child: AgentChild;
  readonly conn: AcpClientConnection;
  /** The run's ACP session, prompted again by the follow-up. */
  readonly sessionId: string;
  /** The session's config options as the agent last announced them (config sequencing starts from these). */
  readonly configOptions: NewSessionResponse["configOptions"];
}

/** What a follow-up must share with the kept agent to take it. */
export type KeptMatch = Pick<KeptAgent, "providerId" | "projectId" | "tenant" | "cwd" | "sessionId">;

export interface KeptAgentsOptions {
  /** `[acp] keep_agent_alive_secs` in ms; 0: nothing is kept. */
  keepMs: number;
  logger: Logger;
  /** End a kept agent as a run's cleanup would (its tree, its row's child, its pool user); resolves once done. */
  stop: (kept: KeptAgent) => Promise<void>;
}

type Entry = { kept: KeptAgent; timer: NodeJS.Timeout };

export class KeptAgents {
  readonly #o: KeptAgentsOptions;
  /** By run id, oldest first (the first is the one `makeRoom` stops). */
  readonly #entries = new Map<string, Entry>();
  /** Stops under way (close() waits for them). */
  readonly #stopping = new Set<Promise<void>>();
  #closed = false;

  constructor(options: KeptAgentsOptions) {
    this.#o = options;
  }

  get size(): number {
    return this.#entries.size;
  }

  /** Whether a run's agent may be kept now (on, not closing, room left). */
  get accepting(): boolean {
    return this.#o.keepMs > 0 && !this.#closed && this.#entries.size < MAX_KEPT_AGENTS;
  }

  /** Keep `kept` for keep_agent_alive_secs; false (nothing kept, the caller cleans up as always) if it may not be. */
  keep(kept: KeptAgent): boolean {
    if (!this.accepting || this.#entries.has(kept.runId) || !alive(kept)) return false;
    const timer = setTimeout(() => this.#stop(kept.runId, "expired"), this.#o.keepMs);
    timer.unref();
    this.#entries.set(kept.runId, { kept, timer });
    // If it dies meanwhile, it is swept now rather than at the end of its time.
    void kept.child.exited.then(() => {
      if (this.#entries.get(kept.runId)?.kept === kept) this.#stop(kept.runId, "exited");
    });
    this.#o.logger.info({ run_id: kept.runId, pgid: kept.child.pgid, keep_ms: this.#o.keepMs }, "agent kept alive");
    return true;
  }

  /**
   * The kept agent of run `runId` for its follow-up, if it is there, alive and matches `match` in every part;
   * it is no longer kept then (the follow-up owns it, and its pool user: the same caller's, leased all along). A kept agent that does not match is stopped: the
   * follow-up goes cold, and no process of that run serves anything else.
   */
  take(runId: string, match: KeptMatch): KeptAgent | null {
    const entry = this.#entries.get(runId);
    if (entry === undefined) return null;
    const k = entry.kept;
    const same =
      k.providerId === match.providerId &&
      k.projectId === match.projectId &&
      k.tenant === match.tenant &&
      k.cwd === match.cwd &&
      k.sessionId === match.sessionId;
    if (!same || !alive(k)) {
      this.#stop(runId, same ? "exited" : "mismatch");
      return null;
    }
    clearTimeout(entry.timer);
    this.#entries.delete(runId);
    this.#o.logger.info({ run_id: runId, pgid: k.child.pgid }, "kept agent taken by its follow-up");
    return k;
  }

  /**
   * The kept agent a follow-up takes over (`take`), or null: its turn spawns one (cold). Only a continuation of a
   * session, in the project's own tree (`shared`, no base ref): never a fresh run.
   */
  forFollowUp(
    req: RunStartRequest,
    agent: AgentConfig,
    project: ProjectConfig,
    continueSessionId: string | null,
  ): KeptAgent | null {
    const parent = req.continue_run_id;
    if (parent === undefined || continueSessionId === null) return null;
    if (project.workspace !== "shared" || req.base_ref !== undefined) return null;
    return this.take(parent, {
      providerId: agent.id,
      projectId: project.id,
      tenant: req.tenant,
      cwd: project.root,
      sessionId: continueSessionId,
    });
  }

  /** Whether run `runId`'s agent is kept (its follow-up may take it). */
  has(runId: string): boolean {
    return this.#entries.has(runId);
  }

  /**
   * Stop the oldest kept agents until `busy` runs plus the kept ones leave room for one more under `max`
   * (`[acp] max_concurrent_runs`). `spare`: the agent the new run may take (a follow-up's parent's), not counted.
   */
  makeRoom(busy: number, max: number, spare: string | undefined): void {
    const others = () => this.#entries.size - (spare !== undefined && this.#entries.has(spare) ? 1 : 0);
    for (const runId of [...this.#entries.keys()]) {
      if (busy + others() < max) return;
      if (runId !== spare) this.#stop(runId, "capacity");
    }
  }

  /** The Runner stops: every kept agent is stopped; resolves once all are (and any stop already under way). */
  async close(): Promise<void> {
    this.#closed = true;
    for (const runId of [...this.#entries.keys()]) this.#stop(runId, "shutdown");
    await Promise.all([...this.#stopping]);
  }

  #stop(runId: string, why: "expired" | "exited" | "mismatch" | "capacity" | "shutdown"): void {
    const entry = this.#entries.get(runId);
    if (entry === undefined) return;
    clearTimeout(entry.timer);
    this.#entries.delete(runId);
    this.#o.logger.info({ run_id: runId, pgid: entry.kept.child.pgid, why }, "kept agent stopped");
    const done = this.#o.stop(entry.kept).catch((error: unknown) => {
      this.#o.logger.error({ run_id: runId, err_name: (error as Error)?.name }, "stopping a kept agent failed");
    });
    this.#stopping.add(done);
    void done.finally(() => this.#stopping.delete(done));
  }
}

function alive(kept: KeptAgent): boolean {
  return kept.child.exit === null && !kept.conn.closed && !kept.conn.stdoutEnded;
}
