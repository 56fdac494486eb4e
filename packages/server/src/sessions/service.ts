/**
 * Workflow Sessions (design §11): a bounded evidence and collaboration
 * ledger for one project, owned by one principal. It grants no authority.
 *
 * - Writing (create, update) needs `runtime:write`, reading `runtime:read`,
 *   plus the exact project grant; neither implies `coding_agent:run` nor is
 *   implied by it. Another principal's session is `not_found`.
 * - Recorder: a run started with `workflow_session_id` is linked to that
 *   session (checked before dispatch: owned, same project). The Server then
 *   appends `coding_agent_started`, `coding_agent_waiting_permission` and
 *   `coding_agent_terminal` entries — ids, state, stop reason, failure kind,
 *   times; never bodies, never the ACP session id. A replay finds the link
 *   and appends nothing. Nothing of the session reaches the Runner.
 * - Context handoff: `context_session_id` freezes the session's handoff and
 *   goal (with versions) into a fixed, delimited preamble quoted before the
 *   caller's prompt. The composed prompt is what the run core fingerprints
 *   and bounds, so a changed session under the same key is an
 *   `idempotency_conflict`, and a replay never sends anything again. A caller that reviewed the session
 *   pins the `version` it read (`context_session_version`): a different current version refuses the
 *   start (`context_version_conflict`) before anything is recorded. The pin is named in the preamble's
 *   header, so it is part of the composed prompt and hence of the intent fingerprint. The quoted texts
 *   are made inert first (`inertQuote`). The preamble and its checks are sessions/context.ts.
 *
 * Atomicity (state/engine.ts): an update reads the session with `lockSession` (SELECT … FOR UPDATE) in the
 * transaction that writes it, so `expected_version` is checked against the row it replaces; the recorder's
 * ownership check, link and `coding_agent_started` entry run in the admission transaction, the session
 * locked; a terminal entry is written by the one transaction whose `markTerminal` changed the link row; a
 * create counts and inserts under its principal's advisory lock (`createLock`). The pinned version and the
 * quoted texts come from one read of the row (one statement: one snapshot on both engines).
 */
import { AsyncResource } from "node:async_hooks";
import { randomBytes } from "node:crypto";
import { base32, isTerminalState } from "@webcodex/protocol";
import type { Logger } from "pino";
import { grantRefusal, missingScopes } from "../principals/authority.js";
import type { Principal, Scope } from "../principals/principal.js";
import type { AdmissionFences, ApiError, ApiErrorCode, ApiResult, StartHooks } from "../runs/api.js";
import type { StateQueries } from "../state/engine.js";
import type { AdmissionRecord } from "../state/record.js";
import type { StateStore } from "../state/store.js";
import { type ContextSnapshot, composeFromSession } from "./context.js";
import {
  DEFAULT_SESSION_MAX_IDLE_SECS,
  type EvidenceKind,
  MAX_SESSIONS_PER_PRINCIPAL,
  SESSION_PRUNE_BATCH,
  type SessionRow,
  type SessionStore,
} from "./store.js";

export {
  type ContextSnapshot,
  composeContextPrompt,
  inertQuote,
  NEUTRALISED_LINE_PREFIX,
} from "./context.js";

export const SESSION_ID_PREFIX = "wc_sess_";
// The handoff and goal bounds are the tools' contract (the protocol package's tools/sessions.ts).
export { MAX_GOAL_BYTES, MAX_HANDOFF_BYTES } from "@webcodex/protocol";
/** Evidence entries one read returns at most (`has_more` says there are more). */
export const MAX_EVIDENCE_PER_READ = 100;
/**
 * How often `create` prunes idle sessions at most (the constructor always prunes). Equal to the smallest
 * `session_max_idle_secs`, so a session is deleted at most this late; a full batch, or a principal at
 * MAX_SESSIONS_PER_PRINCIPAL, prunes again at once.
 */
export const SESSION_PRUNE_INTERVAL_MS = 60_000;
/** Recorded runs without a terminal entry that one Server start looks at to write the missing entries. */
export const MAX_CATCH_UP_RUNS = 10_000;

/** What a caller sees of a session: its row less the owner and the evidence bookkeeping. */
export type SessionView = Omit<SessionRow, "principal_id" | "evidence_last_seq" | "evidence_dropped">;

export interface EvidenceView {
  seq: number;
  at: string;
  kind: EvidenceKind;
  run_id: string;
  provider_id: string;
  state: string;
  execution_state: string;
  stop_reason?: string;
  failure_kind?: string;
}

/** The advisory lock (state/engine.ts `{lock}`) a principal's session creations take turns on. */
export function createLock(principalId: string): string {
  return `workflow_sessions.create:${principalId}`;
}

function err(code: ApiErrorCode, message: string, recovery_kind: ApiError["recovery_kind"]): ApiError {
  return { code, message, recovery_kind };
}

function view(row: SessionRow): SessionView {
  return {
    session_id: row.session_id,
    project_id: row.project_id,
    title: row.title,
    handoff: row.handoff,
    handoff_version: row.handoff_version,
    goal: row.goal,
    goal_version: row.goal_version,
    version: row.version,
    created_at: row.created_at,
    updated_at: row.updated_at,
  };
}

export class SessionService {
  readonly #sessions: SessionStore;
  readonly #records: StateStore;
  readonly #log: Logger;

  readonly #maxIdleMs: number;
  /** The session store's clock (ms) before which `create` does not prune again (this instance's pace only). */
  #nextPruneAt = 0;
  /**
   * Evidence writes per run still in progress, chained so one run's entries are written in the order its
   * states changed. An entry leaves when its chain is done, so this holds at most the runs changing state
   * right now.
   */
  readonly #evidenceChains = new Map<string, Promise<void>>();
  /** The async context of construction: evidence writes start there, outside any transaction's scope. */
  readonly #outside = new AsyncResource("webcodex.session-evidence");

  /**
   * `maxIdleSecs`: `[server] session_max_idle_secs` (idle sessions are deleted at `start`, and on a create
   * at most once per SESSION_PRUNE_INTERVAL_MS). Call `start` once.
   */
  constructor(
    sessions: SessionStore,
    records: StateStore,
    logger: Logger,
    maxIdleSecs: number = DEFAULT_SESSION_MAX_IDLE_SECS,
  ) {
    this.#sessions = sessions;
    this.#maxIdleMs = maxIdleSecs * 1000;
    this.#records = records;
    this.#log = logger;
    records.onStateChange((rec) => {
      // Only these states write evidence; the listener may be called inside a writer's transaction.
      if (rec.state === "waiting_permission" || isTerminalState(rec.state)) this.#queueRunState(rec);
    });
  }

  /** At Server start: terminal entries a previous process could not write, then one prune. */
  async start(): Promise<void> {
    await this.#catchUp();
    await this.#prune();
  }

  /** Resolves when every evidence write queued so far is done (tests, shutdown). */
  async settled(): Promise<void> {
    while (this.#evidenceChains.size > 0) await Promise.all(this.#evidenceChains.values());
  }

  #queueRunState(rec: AdmissionRecord): void {
    const previous = this.#evidenceChains.get(rec.run_id) ?? Promise.resolve();
    // Started in the construction context, never in the caller's: the state change may come from inside
    // another transaction, whose handle alone may be used there (state/engine.ts).
    const next = this.#outside.runInAsyncScope(() =>
      previous.then(() =>
        this.#onRunState(rec).catch((e: unknown) => {
          this.#log.error({ run_id: rec.run_id, err: e instanceof Error ? e.name : typeof e }, "evidence not recorded");
        }),
      ),
    );
    this.#evidenceChains.set(rec.run_id, next);
    void next.then(() => {
      if (this.#evidenceChains.get(rec.run_id) === next) this.#evidenceChains.delete(rec.run_id);
    });
  }

  /** Delete idle sessions (one batch), unless `force` is false and the interval has not passed; true when it ran. */
  async #prune(force = false): Promise<boolean> {
    const now = this.#sessions.now().getTime();
    if (!force && now < this.#nextPruneAt) return false;
    const pruned = await this.#sessions.pruneIdle(this.#maxIdleMs);
    // A full batch may have left more: the next create continues at once.
    this.#nextPruneAt = pruned >= SESSION_PRUNE_BATCH ? 0 : now + SESSION_PRUNE_INTERVAL_MS;
    if (pruned > 0) this.#log.info({ pruned }, "idle workflow sessions deleted");
    return true;
  }

  #need(principal: Principal, scope: Scope, projectId: string): ApiError | null {
    const what = scope === "runtime:write" ? "Creating or updating a workflow session" : "Reading a workflow session";
    const denied = missingScopes(principal, [scope], what);
    if (denied) return denied;
    return grantRefusal(principal, projectId);
  }

  /**
   * The caller's own session on a project it may still use; anything else is not found. Given a
   * transaction, the row is locked until it ends (the caller decides on it there).
   */
  async #owned(principal: Principal, sessionId: string, tx?: StateQueries): Promise<SessionRow | ApiError> {
    const row = tx ? await this.#sessions.lockSession(sessionId, tx) : await this.#sessions.session(sessionId);
    if (!row || row.principal_id !== principal.id || !principal.projects.has(row.project_id)) {
      return err("not_found", `No workflow session ${sessionId}.`, "none");
    }
    return row;
  }

  async create(principal: Principal, input: { project_id: string; title: string }): Promise<ApiResult<SessionView>> {
    const denied = this.#need(principal, "runtime:write", input.project_id);
    if (denied) return { ok: false, error: denied };
    const pruned = await this.#prune();
    // At the cap, one of this principal's sessions may have gone idle since the last prune: prune before refusing.
    if (!pruned && (await this.#sessions.countSessions(principal.id)) >= MAX_SESSIONS_PER_PRINCIPAL) {
      await this.#prune(true);
    }
    // The count and the insert under the principal's advisory lock: concurrent creates cannot pass the cap.
    const row = await this.#sessions.transaction(
      async (tx) => {
        if ((await this.#sessions.countSessions(principal.id, tx)) >= MAX_SESSIONS_PER_PRINCIPAL) return null;
        return await this.#sessions.insertSession(
          {
            session_id: SESSION_ID_PREFIX + base32(randomBytes(20)).slice(0, 26),
            principal_id: principal.id,
            project_id: input.project_id,
            title: input.title,
          },
          tx,
        );
      },
      { lock: createLock(principal.id) },
    );
    if (row === null) {
      return {
        ok: false,
        error: err("capacity", `At most ${MAX_SESSIONS_PER_PRINCIPAL} sessions per principal.`, "none"),
      };
    }
    this.#log.info({ session_id: row.session_id, project_id: row.project_id }, "workflow session created");
    return { ok: true, value: view(row) };
  }

  async update(
    principal: Principal,
    input: { session_id: string; handoff?: string; goal?: string; expected_version?: number },
  ): Promise<ApiResult<SessionView>> {
    // Atomic by the session's row lock: `expected_version` is compared with the version this update replaces.
    return await this.#sessions.transaction(async (tx): Promise<ApiResult<SessionView>> => {
      const row = await this.#owned(principal, input.session_id, tx);
      if ("code" in row) return { ok: false, error: row };
      const denied = this.#need(principal, "runtime:write", row.project_id);
      if (denied) return { ok: false, error: denied };
      if (input.expected_version !== undefined && input.expected_version !== row.version) {
        return {
          ok: false,
          error: err(
            "version_conflict",
            `The session is at version ${row.version}, not ${input.expected_version}; read it again, then update.`,
            "reobserve",
          ),
        };
      }
      await this.#sessions.updateTexts(
        row.session_id,
        {
          ...(input.handoff !== undefined ? { handoff: input.handoff } : {}),
          ...(input.goal !== undefined ? { goal: input.goal } : {}),
        },
        tx,
      );
      const updated = (await this.#sessions.session(row.session_id, tx)) ?? row;
      return { ok: true, value: view(updated) };
    });
  }

  async read(
    principal: Principal,
    input: { session_id: string; after?: number },
  ): Promise<ApiResult<SessionView & { evidence: EvidenceView[]; evidence_dropped: number; has_more: boolean }>> {
    const row = await this.#owned(principal, input.session_id);
    if ("code" in row) return { ok: false, error: row };
    const denied = this.#need(principal, "runtime:read", row.project_id);
    if (denied) return { ok: false, error: denied };
    const rows = await this.#sessions.evidenceAfter(row.session_id, input.after ?? 0, MAX_EVIDENCE_PER_READ + 1);
    const evidence = rows.slice(0, MAX_EVIDENCE_PER_READ).map((e) => ({
      seq: e.seq,
      at: e.at,
      kind: e.kind,
      run_id: e.run_id,
      provider_id: e.provider_id,
      state: e.state,
      execution_state: e.execution_state,
      ...(e.stop_reason !== null ? { stop_reason: e.stop_reason } : {}),
      ...(e.failure_kind !== null ? { failure_kind: e.failure_kind } : {}),
    }));
    return {
      ok: true,
      value: {
        ...view(row),
        evidence,
        evidence_dropped: row.evidence_dropped,
        has_more: rows.length > MAX_EVIDENCE_PER_READ,
      },
    };
  }

  // ---- recorder -----------------------------------------------------------------------------

  /**
   * The recorder gate, the one for every start that names `workflow_session_id` (start_coding_agent
   * through StartHooks, start_agent_task_coding_run directly): checked now, before anything is
   * recorded, and the admission `bind` (runs/api.ts) that checks it again inside the transaction that
   * records the admission intent, before `run.start` is sent, then links the run and writes its
   * `coding_agent_started` entry — durable before any dispatch, so a Server killed right after still has
   * it. A re-send of an unacknowledged start finds the link and adds nothing (replays never reach
   * `bind`); a re-admission after a pre-admission rejection is a new dispatch and is recorded as one.
   */
  async recorder(
    principal: Principal,
    sessionId: string,
    projectId: string,
    providerId: string,
    field = "workflow_session_id",
  ): Promise<ApiResult<(fences: AdmissionFences, tx: StateQueries) => Promise<ApiError | null>>> {
    const refused = await this.#checkRecorder(principal, sessionId, projectId, field);
    if (refused) return { ok: false, error: refused };
    return {
      ok: true,
      // In the admission transaction `tx`: ownership again with the session locked (no prune, no other
      // recorder write in between), then the link and the started entry, committed with the intent.
      value: async (fences, tx) => {
        const again = await this.#checkRecorder(principal, sessionId, projectId, field, tx);
        if (again) return again;
        const runId = fences.run_id;
        const existing = await this.#records.get(runId, tx);
        if (!(await this.#sessions.linkRun(runId, sessionId, tx))) {
          if (existing?.admission !== "rejected_pre_admission") return null;
          await this.#sessions.resetTerminal(runId, tx);
        }
        const recorder = (await this.#sessions.recorderOf(runId, tx))?.session_id ?? sessionId;
        await this.#sessions.appendEvidence(
          {
            session_id: recorder,
            kind: "coding_agent_started",
            run_id: runId,
            provider_id: providerId,
            state: "starting",
            execution_state: "not_started",
            stop_reason: null,
            failure_kind: null,
          },
          tx,
        );
        return null;
      },
    };
  }

  /** The recorder must be the caller's own session on the run's project (locked in `tx` when given). */
  async #checkRecorder(
    principal: Principal,
    sessionId: string,
    projectId: string,
    field: string,
    tx?: StateQueries,
  ): Promise<ApiError | null> {
    const row = await this.#owned(principal, sessionId, tx);
    if ("code" in row) return { ...row, message: `${field}: ${row.message} Nothing was started.` };
    if (row.project_id !== projectId) {
      return err(
        "invalid_input",
        `${field}: session ${sessionId} belongs to project ${row.project_id}, not ${projectId}. Nothing was started.`,
        "fix_input",
      );
    }
    return null;
  }

  /**
   * At start: terminal entries the previous process could not write (a run closed by reconciliation
   * before this service listened, e.g. an intent never sent before a crash).
   */
  async #catchUp(): Promise<void> {
    for (const runId of await this.#sessions.openRecordedRuns(MAX_CATCH_UP_RUNS)) {
      const rec = await this.#records.get(runId);
      if (rec && isTerminalState(rec.state)) await this.#onRunState(rec);
    }
  }

  async #onRunState(rec: AdmissionRecord): Promise<void> {
    if (rec.state === "waiting_permission") {
      await this.#sessions.transaction(async (tx) => {
        const link = await this.#sessions.recorderOf(rec.run_id, tx);
        if (link) await this.#append(link.session_id, "coding_agent_waiting_permission", rec, tx);
      });
    } else if (isTerminalState(rec.state)) {
      // The mark and the entry commit together: a failure or a crash between them would leave the run
      // marked and its terminal entry never written (#catchUp only redoes unmarked runs), and a reader
      // could see the mark before the entry. The mark decides: of several writers (this listener, a
      // catch-up, another instance) only the one whose UPDATE changed the row writes the entry.
      await this.#sessions.transaction(async (tx) => {
        const link = await this.#sessions.recorderOf(rec.run_id, tx);
        if (link && (await this.#sessions.markTerminal(rec.run_id, tx))) {
          await this.#append(link.session_id, "coding_agent_terminal", rec, tx);
        }
      });
    }
  }

  async #append(sessionId: string, kind: EvidenceKind, rec: AdmissionRecord, tx: StateQueries): Promise<void> {
    await this.#sessions.appendEvidence(
      {
        session_id: sessionId,
        kind,
        run_id: rec.run_id,
        provider_id: rec.provider_id,
        state: rec.state,
        execution_state: rec.execution_state,
        stop_reason: rec.stop_reason,
        failure_kind: rec.failure_kind,
      },
      tx,
    );
  }

  /** The selectors of start_coding_agent, for the run tools (StartHooks in runs/api.ts). */
  startHooks(): StartHooks {
    return {
      prepare: async (principal, input) => {
        let bind: ((fences: AdmissionFences, tx: StateQueries) => Promise<ApiError | null>) | undefined;
        if (input.workflow_session_id !== undefined) {
          const gate = await this.recorder(
            principal,
            input.workflow_session_id,
            input.project_id,
            input.provider_id,
            input.recorder_field,
          );
          if (!gate.ok) return gate;
          bind = gate.value;
        }
        const withBind = (prompt: string) => ({ ok: true as const, value: bind ? { prompt, bind } : { prompt } });
        if (input.context_session_id === undefined) {
          if (input.context_session_version !== undefined) {
            return {
              ok: false,
              error: err(
                "invalid_input",
                "context_session_version pins the version of context_session_id's session; give context_session_id too. Nothing was started.",
                "fix_input",
              ),
            };
          }
          return withBind(input.prompt);
        }
        const composed = await this.composeWithContext(
          principal,
          input.context_session_id,
          input.project_id,
          input.prompt,
          input.context_session_version,
        );
        return composed.ok ? withBind(composed.value.prompt) : composed;
      },
    };
  }

  // ---- context handoff ---------------------------------------------------------------------

  /**
   * Freeze the caller's session (runtime:read, owned, exact project) and compose the run's prompt.
   * `pinnedVersion`: the session `version` the caller reviewed; any other current version is a
   * `context_version_conflict`.
   */
  async composeWithContext(
    principal: Principal,
    sessionId: string,
    projectId: string,
    prompt: string,
    pinnedVersion?: number,
  ): Promise<ApiResult<{ prompt: string; snapshot: ContextSnapshot }>> {
    // One read of the row: ownership, project, the pinned version and the quoted texts all come from it,
    // so the texts quoted are exactly those of the version checked.
    const row = await this.#owned(principal, sessionId);
    if ("code" in row) {
      return { ok: false, error: { ...row, message: `context_session_id: ${row.message} Nothing was started.` } };
    }
    return composeFromSession(principal, row, sessionId, projectId, prompt, pinnedVersion);
  }
}
