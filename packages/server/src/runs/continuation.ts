/**
 * Continuation (design §17): a run that resumes an earlier run's ACP session. What the Server checks before
 * anything is recorded — the parent is the caller's, terminal, on the same project and provider, and the
 * provider's agent can resume or load a session — and the durable parent→child link, written in the child's
 * admission transaction (`bind`), one child per parent (the table's primary key). Nothing here is secret: the
 * link is two run ids.
 */
import { isTerminalState, type ProviderAdvert, type RunState } from "@webcodex/protocol";
import type { Principal } from "../principals/principal.js";
import type { StateQueries } from "../state/engine.js";
import type { AdmissionRecord } from "../state/record.js";
import type { StateStore } from "../state/store.js";
import type { AdmissionRequest, ApiError } from "./api.js";

/** The two directions of a run's link, as observe names them. */
export interface ContinuationLinks {
  parent_run_id?: string;
  continued_by?: string;
}

function refusal(code: ApiError["code"], message: string, recovery: ApiError["recovery_kind"]): ApiError {
  return { code, message, recovery_kind: recovery };
}

/**
 * The parent checks, before anything is recorded. Another principal's run answers exactly as an unknown one
 * does, so a caller learns nothing of runs that are not theirs.
 */
export function checkParent(
  principal: Principal,
  parentId: string,
  parent: AdmissionRecord | undefined,
  child: { project_id: string; provider_id: string; base_ref?: string },
): ApiError | null {
  if (child.base_ref !== undefined) {
    return refusal(
      "invalid_input",
      "base_ref cannot be given with continue_run_id: a follow-up turn continues from its parent's workspace (in a worktree project, on its parent's branch from its recorded head). Nothing was started: drop base_ref.",
      "fix_input",
    );
  }
  if (parent === undefined || parent.principal_id !== principal.id) {
    return refusal(
      "not_found",
      `continue_run_id: no run ${parentId} of yours to continue; nothing was started. Name one of your own terminal runs.`,
      "fix_input",
    );
  }
  if (!isTerminalState(parent.state)) {
    return refusal(
      "invalid_input",
      `continue_run_id: run ${parentId} is still ${parent.state}; a run can be continued only once it is terminal. Nothing was started: wait for it to end (observe_coding_agent), then retry.`,
      "wait",
    );
  }
  if (parent.project_id !== child.project_id) {
    return refusal(
      "invalid_input",
      `continue_run_id: run ${parentId} ran on project ${parent.project_id}, not ${child.project_id}; a continuation stays on its parent's project. Nothing was started.`,
      "fix_input",
    );
  }
  if (parent.provider_id !== child.provider_id) {
    return refusal(
      "invalid_input",
      `continue_run_id: run ${parentId} ran provider ${parent.provider_id}, not ${child.provider_id}; a continuation stays with its parent's provider. Nothing was started.`,
      "fix_input",
    );
  }
  return null;
}

/** The provider's agent can resume (or load) a session, as its Runner's hello advertised. */
export function checkProviderContinues(provider: ProviderAdvert): ApiError | null {
  const how = provider.continuation ?? "none";
  if (how !== "none") return null;
  return refusal(
    "continuation_unsupported",
    `Provider ${provider.provider_id} (${provider.name}) cannot continue a run: its agent advertises neither session/resume nor session/load. Nothing was started; start a fresh run instead.`,
    "none",
  );
}

/**
 * Continuation for every caller of the one admission path (start_coding_agent, the task run): the parent's
 * checks before anything is recorded, and the parent → child link written with the intent, in the caller's
 * `bind` transaction (one child per parent). A request that continues nothing is returned as is.
 */
export async function continuationRequest(
  store: StateStore,
  principal: Principal,
  req: AdmissionRequest,
): Promise<AdmissionRequest | ApiError> {
  const parentId = req.continue_run_id;
  if (parentId === undefined) return req;
  const refused = checkParent(principal, parentId, await store.get(parentId), req);
  if (refused) return refused;
  const callerBind = req.bind;
  return {
    ...req,
    bind: async (fences, tx) =>
      (await linkContinuation(tx, parentId, req.run_id)) ?? (await callerBind?.(fences, tx)) ?? null,
  };
}

/**
 * Inside the child's admission transaction: link parent → child, unless the parent already has another child
 * (`continuation_conflict`). The same child again (a same-key retry, a re-admission) is no conflict.
 */
export async function linkContinuation(tx: StateQueries, parentId: string, childId: string): Promise<ApiError | null> {
  // ON CONFLICT DO NOTHING: of two children racing (on any instance) one inserts, the other waits for its
  // commit and inserts nothing, then reads who won.
  const inserted = await tx.run(
    "INSERT INTO run_continuations (parent_run_id, child_run_id, created_at) VALUES (?, ?, ?) ON CONFLICT (parent_run_id) DO NOTHING",
    [parentId, childId, new Date().toISOString()],
  );
  if (inserted.changes === 1) return null;
  const existing = await tx.get<{ child_run_id: string }>(
    "SELECT child_run_id FROM run_continuations WHERE parent_run_id = ?",
    [parentId],
  );
  if (existing === undefined || existing.child_run_id === childId) return null;
  return refusal(
    "continuation_conflict",
    `continue_run_id: run ${parentId} was already continued by run ${existing.child_run_id}; a conversation is a chain, one follow-up per run. Nothing was started: continue ${existing.child_run_id} instead.`,
    "fix_input",
  );
}

/** A run's parent and child, if any (observe). */
export async function continuationLinks(q: StateQueries, runId: string): Promise<ContinuationLinks> {
  const rows = await q.all<{ parent_run_id: string; child_run_id: string }>(
    "SELECT parent_run_id, child_run_id FROM run_continuations WHERE parent_run_id = ? OR child_run_id = ?",
    [runId, runId],
  );
  const links: ContinuationLinks = {};
  for (const row of rows) {
    if (row.child_run_id === runId) links.parent_run_id = row.parent_run_id;
    if (row.parent_run_id === runId) links.continued_by = row.child_run_id;
  }
  return links;
}

/** Runs whose parent link `ObservedLinks` remembers at most (the least recently read go first). */
export const OBSERVED_PARENT_LINKS_ENTRIES = 4_096;

/**
 * A run's links as observe shows them, without a database read per observe while the run is not terminal.
 * Its parent never changes: the link is written in the transaction that records the run (`linkContinuation`
 * through the admission's bind), so it is there before anyone can observe the run, and links are never
 * deleted. Nothing continues a run before it is terminal (`checkParent`; terminal is final), so while the
 * record observe shows is not terminal, `continued_by` is absent and the parent read once is the whole
 * answer. A terminal run's links are read every time: `continued_by` may appear, written by any instance.
 */
export class ObservedLinks {
  readonly #parents = new Map<string, string | null>();

  /** The links of `runId`, whose record observe shows in `state`. */
  async of(q: StateQueries, runId: string, state: RunState): Promise<ContinuationLinks> {
    if (!isTerminalState(state)) {
      const parent = this.#parents.get(runId);
      if (parent !== undefined) {
        // Most recently read last: the first entry is the one to drop at the bound.
        this.#parents.delete(runId);
        this.#parents.set(runId, parent);
        return parent === null ? {} : { parent_run_id: parent };
      }
    }
    const links = await continuationLinks(q, runId);
    if (this.#parents.size >= OBSERVED_PARENT_LINKS_ENTRIES && !this.#parents.has(runId)) {
      const oldest = this.#parents.keys().next().value;
      if (oldest !== undefined) this.#parents.delete(oldest);
    }
    this.#parents.set(runId, links.parent_run_id ?? null);
    return links;
  }
}
