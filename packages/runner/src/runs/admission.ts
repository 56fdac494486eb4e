/**
 * The checks a run.start passes before anything of it is recorded (design §4.2): an id already known (in memory,
 * in the store or as a tombstone) is answered, never admitted again; then the fences (this Runner instance, the
 * provider instance), the provider and project, the project's allow_patch, capacity (never a queue) and which
 * caller a shared project serves under run_as (runs/project-callers.ts). A start that passes is admitted — maybe
 * to end at once, not started, when its project serves another caller or its parent's session is not here.
 *
 * The run_as pool user is leased after these checks (process/user-pool.ts); its refusals are `capacityRefusal`s
 * and a user being recycled for the caller is waited for up to RECYCLE_WAIT_MS. A slot or a user still held by a
 * run that has ended (its agent being stopped) is waited for up to SETTLE_WAIT_MS (RunManager.start).
 */
import {
  CAPACITY_REASONS,
  type CapacityReason,
  FAILURE_SUMMARIES,
  type RunSummary,
  TOMBSTONE_MESSAGE,
} from "@webcodex/protocol";
import { notStarted, type Terminal } from "../acp/terminal.js";
import type { AgentConfig, ProjectConfig } from "../config/config.js";
import type { Logger } from "../logger.js";
import { NO_TENANT } from "../process/user-bindings.js";
import { fingerprintPrefix, wireTombstone } from "../store/tombstone.js";
import type { DispatchStore } from "../store/types.js";
import { PROJECT_SERVES_ANOTHER_CALLER, type ProjectCallers } from "./project-callers.js";
import type { RunStartOutcome, RunStartRequest } from "./service.js";

/** What a start refused for want of a run_as user is told besides its capacity reason. */
export const UNRECORDED_REFUSAL =
  "The Runner could not record which caller its run_as user serves; nothing was started.";
/** Longest a start waits for an idle pool user being recycled for its caller before it is refused `pool_recycling`. */
export const RECYCLE_WAIT_MS = 10_000;

/** A continuing run whose parent's ACP session this Runner does not hold (pruned, another store or provider). */
const NO_PARENT_SESSION =
  "This Runner holds no agent session of the run to continue (its record was pruned, or it ran elsewhere).";

/** A `capacity` refusal: the fixed summary of its reason (protocol capacity.ts), and the reason itself. */
export function capacityRefusal(reason: CapacityReason): RunStartOutcome {
  return { ok: false, code: "capacity", message: CAPACITY_REASONS[reason].summary, capacity_reason: reason };
}

/**
 * Longest a start waits, all its waits together, for runs that have ended (their terminal told) but whose agents
 * are still being stopped to free a slot or a pool user, before it is refused `runner_full`, `pool_busy` or
 * `caller_limit`. Above the Runner's own cleanup (stdin EOF, SIGTERM, SIGKILL, each given the cleanup grace), and
 * well under the Server's wait for a `run.start` answer.
 */
export const SETTLE_WAIT_MS = 10_000;

/** Whether a pool user being recycled for the caller is ready within RECYCLE_WAIT_MS. */
export function recycledInTime(ready: Promise<void>): Promise<boolean> {
  return readyInTime(ready, RECYCLE_WAIT_MS);
}

/** Whether `ready` resolves within `ms`. */
export async function readyInTime(ready: Promise<void>, ms: number): Promise<boolean> {
  const timer = AbortSignal.timeout(ms);
  return Promise.race([
    ready.then(() => true),
    new Promise<false>((resolve) => timer.addEventListener("abort", () => resolve(false), { once: true })),
  ]);
}

/**
 * What the checks decide: the answer to give now (a refusal, or the run this id already names), or a run to
 * admit with its agent and project — `ended` when it is to end at once, before anything is spawned.
 */
export type StartCheck =
  | { kind: "answer"; outcome: RunStartOutcome }
  | {
      kind: "admit";
      agent: AgentConfig;
      project: ProjectConfig;
      /** The parent run's ACP session a continuation resumes (design §17); null: a fresh session. */
      continueSessionId: string | null;
      ended: Terminal | null;
    };

export interface StartChecksOptions {
  store: DispatchStore;
  logger: Logger;
  agentInstanceId: string;
  agents: ReadonlyMap<string, AgentConfig>;
  /** The current provider_instance_id of each configured agent. */
  providerInstanceIds: ReadonlyMap<string, string>;
  projects: ReadonlyMap<string, ProjectConfig>;
  maxConcurrentRuns: number;
  /** Which caller each project serves its run_as runs to; null under `[acp] single_tenant`. */
  projectCallers: ProjectCallers | null;
  now: () => Date;
}

export class StartChecks {
  readonly #o: StartChecksOptions;

  constructor(options: StartChecksOptions) {
    this.#o = options;
  }

  /** `existing`: the run this id already names, if any; `activeRuns`: the runs holding a capacity slot. */
  check(req: RunStartRequest, existing: RunSummary | null, activeRuns: number): StartCheck {
    const { store, logger } = this.#o;
    const answer = (outcome: RunStartOutcome): StartCheck => ({ kind: "answer", outcome });
    if (existing) {
      if (existing.intent_fingerprint === req.intent_fingerprint) {
        return answer({ ok: true, run: existing, created: false });
      }
      return answer({
        ok: false,
        code: "idempotency_conflict",
        message: "A run with this id exists with a different intent.",
        run: existing,
      });
    }
    // Admitted once, row pruned since: answer what is recorded, never admit it again.
    const tomb = store.tombstone(req.run_id);
    if (tomb) {
      if (tomb.fingerprintPrefix !== fingerprintPrefix(req.intent_fingerprint)) {
        return answer({
          ok: false,
          code: "idempotency_conflict",
          message: "A run with this id was admitted with a different intent.",
        });
      }
      logger.info({ run_id: req.run_id, state: tomb.state }, "start of a pruned run answered from its tombstone");
      return answer({ ok: false, code: "pruned", message: TOMBSTONE_MESSAGE, tombstone: wireTombstone(tomb) });
    }
    if (req.agent_instance_id !== this.#o.agentInstanceId) {
      return answer({ ok: false, code: "stale_runner", message: "The Runner instance changed; refresh and retry." });
    }
    const agent = this.#o.agents.get(req.provider_id);
    if (!agent) return answer({ ok: false, code: "unknown_provider", message: "The Runner has no such provider." });
    if (req.provider_instance_id !== this.#o.providerInstanceIds.get(agent.id)) {
      return answer({ ok: false, code: "stale_provider", message: FAILURE_SUMMARIES.stale_provider });
    }
    const project = this.#o.projects.get(req.project_id);
    if (!project) return answer({ ok: false, code: "unknown_project", message: "The Runner has no such project." });
    if (!project.allowPatch) {
      return answer({
        ok: false,
        code: "project_not_writable",
        message: "The project does not allow agent runs (allow_patch).",
      });
    }
    // Continuation (design §17): the parent's ACP session, kept in this store; none here ends the run not started.
    const parent = req.continue_run_id === undefined ? null : store.get(req.continue_run_id);
    const continueSessionId = parent?.provider_id === agent.id ? store.acpSessionOf(parent.run_id) : null;
    const orphan = req.continue_run_id !== undefined && continueSessionId === null;
    if (activeRuns >= this.#o.maxConcurrentRuns) return answer(capacityRefusal("runner_full"));
    // A project's tree serves one caller's run_as runs (runs/project-callers.ts): another caller's run is
    // admitted and ends failed / not_started with the fixed reason, before a pool user is leased or bound.
    const served = this.#serveProject(project, agent, req.tenant);
    if (served === "unrecorded") {
      return answer({
        ok: false,
        code: "internal",
        message: "The Runner could not record which caller its project serves.",
      });
    }
    const ended =
      served === "other"
        ? notStarted("provider_spawn_failed", "spawn", PROJECT_SERVES_ANOTHER_CALLER)
        : orphan
          ? notStarted("provider_rejected", "session_new", NO_PARENT_SESSION)
          : null;
    return { kind: "admit", agent, project, continueSessionId, ended };
  }

  /**
   * Whether `project` may serve a run of `tenant` with `agent`: "ok" (binding it to the tenant first when it
   * serves no one yet), "other" (it serves another caller), or "unrecorded" (the binding could not be written).
   */
  #serveProject(project: ProjectConfig, agent: AgentConfig, tenant: string | undefined): "ok" | "other" | "unrecorded" {
    const callers = this.#o.projectCallers;
    // A worktree project gives each run a workspace of its own (workspace/owned.ts): no tree is shared.
    if (callers === null || agent.runAs === null || project.sharedBetweenCallers || project.workspace === "worktree")
      return "ok";
    const caller = tenant ?? NO_TENANT;
    try {
      const served = callers.servedBy(project.id);
      if (served !== undefined) return served === caller ? "ok" : "other";
      callers.bind(project.id, caller, this.#o.now());
      this.#o.logger.info({ project_id: project.id }, "project bound to the caller of its first run_as run");
      return "ok";
    } catch (error) {
      this.#o.logger.error({ project_id: project.id, err_name: (error as Error)?.name }, "project binding failed");
      return "unrecorded";
    }
  }
}
