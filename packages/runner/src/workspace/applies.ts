/**
 * `run.apply` for a worktree run (design §16): bring the run's recorded change into a branch (workspace/apply.ts's
 * git steps), once per idempotency key. The answer is recorded durably under (run, key hash) and a same-key call
 * gets it again — a conflict's paths computed anew from the same two commits; a key used for another branch is a
 * conflict; a refusal changes nothing and is not recorded. Called by `Workspaces.apply` after every earlier write
 * to the project's repository.
 */
import { type ApplyRefusal, MAX_APPLIES_PER_RUN, type RunApply } from "@webcodex/protocol";
import type { ProjectConfig } from "../config/config.js";
import type { Logger } from "../logger.js";
import type { ApplyRow, DispatchStore, WorkspaceRow } from "../store/types.js";
import { applyChange, mergeTree } from "./apply.js";
import { errName } from "./log-fields.js";

export type ApplyOutcome =
  | { ok: true; apply: RunApply }
  | { ok: false; refusal: ApplyRefusal }
  | { ok: false; code: "idempotency_conflict" | "internal"; message: string };

export const APPLY_KEY_REUSED =
  "This idempotency_key was used to apply this run's change into another branch; use a new key.";
export const APPLY_FAILED = "The Runner could not apply the run's change; nothing was remembered under the key.";

/** One apply of a worktree project's run: `terminal`, the run's row is terminal. */
export interface ApplyRequest {
  runId: string;
  project: ProjectConfig;
  terminal: boolean;
  target: string;
  keyHash: string;
}

/**
 * Bring the run's recorded change into `target` (workspace/apply.ts), once per idempotency key: the answer is
 * recorded durably under (run, key hash) and a same-key call gets it again — a conflict's paths computed anew from
 * the same two commits. A refusal changes nothing and is not recorded.
 */
export async function applyOnce(store: DispatchStore, log: Logger, req: ApplyRequest): Promise<ApplyOutcome> {
  const { runId, project, terminal, target, keyHash } = req;
  try {
    // Its row is written once the run's base is resolved, after the run was admitted.
    const row = store.workspace(runId);
    if (!row) return { ok: false, refusal: { reason: terminal ? "no_change" : "not_terminal" } };
    const known = store.applyOf(runId, keyHash);
    if (known) {
      if (known.target_branch !== target) return { ok: false, code: "idempotency_conflict", message: APPLY_KEY_REUSED };
      return { ok: true, apply: await replay(project.root, known, row) };
    }
    if (!terminal) return { ok: false, refusal: { reason: "not_terminal" } };
    const head = row.head_commit;
    if (head === null) return { ok: false, refusal: { reason: "change_not_recorded" } };
    if (head === row.base_commit) return { ok: false, refusal: { reason: "no_change" } };
    if (store.applyCount(runId) >= MAX_APPLIES_PER_RUN) {
      return { ok: false, refusal: { reason: "apply_limit" } };
    }
    const step = await applyChange(project.root, { runId, head, target, author: project.workspaceAuthor });
    if (step.kind === "refused") return { ok: false, refusal: step.refusal };
    // Recorded once git has moved the target: a crash in between leaves the target applied and no answer,
    // so a same-key retry applies again and finds the target up to date (nothing is applied twice).
    store.recordApply({
      run_id: runId,
      key_hash: keyHash,
      target_branch: target,
      result: step.result,
      target_before: step.target_before,
      target_after: step.target_after,
    });
    log.info({ run_id: runId, result: step.result }, "run change applied");
    return {
      ok: true,
      apply: {
        run_id: runId,
        target_branch: target,
        result: step.result,
        applied: step.result === "fast_forward" || step.result === "merged",
        head_commit: head,
        target_before: step.target_before,
        target_after: step.target_after,
        ...(step.conflicts ? { conflicts: step.conflicts.paths, conflicts_truncated: step.conflicts.truncated } : {}),
      },
    };
  } catch (error) {
    log.error({ run_id: runId, err_name: errName(error) }, "applying the run's change failed");
    return { ok: false, code: "internal", message: APPLY_FAILED };
  }
}

/** The answer recorded under a key, as it was given (a conflict's paths from the same two commits). */
async function replay(root: string, known: ApplyRow, row: WorkspaceRow): Promise<RunApply> {
  const head = row.head_commit ?? row.base_commit;
  const base: RunApply = {
    run_id: known.run_id,
    target_branch: known.target_branch,
    result: known.result,
    applied: known.result === "fast_forward" || known.result === "merged",
    head_commit: head,
    target_before: known.target_before,
    target_after: known.target_after,
  };
  if (known.result !== "conflict") return base;
  const merged = await mergeTree(root, known.target_before, head);
  const conflicts = merged.clean ? { paths: [], truncated: false } : merged.conflicts;
  return { ...base, conflicts: conflicts.paths, conflicts_truncated: conflicts.truncated };
}
