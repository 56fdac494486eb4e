/**
 * apply_coding_agent_changes (design §16): bring a worktree run's recorded change into a branch of its project,
 * asked of the run's Runner (`run.apply`, through the instance holding its link on a PostgreSQL state). It needs
 * `project:write` and `coding_agent:run`, and the ownership rule of observe (which includes the project grant):
 * another principal's run looks exactly like no run.
 *
 * Idempotency lives on the Runner: it records the answer under (run_id, SHA-256 of the key) in its own store, in
 * the same serialized step that moved the branch, so the answer survives a restart of either side and a Server
 * instance that never saw the first call answers a retry the same. The Server never sees the key travel: only its
 * hash goes on the link. Paths (conflicts, uncommitted work) are project content: to the caller only — never the
 * state database, the audit (run id and outcome code only) or a log line.
 */
import { createHash } from "node:crypto";
import {
  APPLY_TIMEOUT_MS,
  type ApplyRefusal,
  type ApplyRefusalReason,
  type ApplyToolInput,
  type RecoveryKind,
  type RunApply,
} from "@webcodex/protocol";
import { missingScopes } from "../principals/authority.js";
import type { Principal } from "../principals/principal.js";
import type { ApiResult } from "./api.js";
import { fail, type RunContext } from "./context.js";

/** Paths named in a refusal's message (all of them, up to MAX_APPLY_PATHS, are in `paths`). */
const PATHS_IN_MESSAGE = 10;

const REFUSALS: Record<ApplyRefusalReason, { recovery: RecoveryKind; say: (runId: string, target: string) => string }> =
  {
    shared_project: {
      recovery: "none",
      say: (r) =>
        `Run ${r} has no change to apply: its project does not use workspaces (workspace = "shared"), so the run worked in the project's tree directly.`,
    },
    not_terminal: {
      recovery: "wait",
      say: (r) => `Run ${r} has not ended yet; apply its change once observe_coding_agent shows it terminal.`,
    },
    change_not_recorded: {
      recovery: "wait",
      say: (r) =>
        `Run ${r} ended but its Runner has not recorded its change yet (it does so at its next start-up); try again later.`,
    },
    no_change: {
      recovery: "none",
      say: (r) =>
        `Run ${r} recorded no change (its branch is at its base commit, or it ended before its checkout was made): there is nothing to apply.`,
    },
    unknown_branch: {
      recovery: "fix_input",
      say: (_r, t) => `target_branch '${t}' names no branch of the project; name an existing branch.`,
    },
    checked_out_elsewhere: {
      recovery: "fix_input",
      say: (_r, t) =>
        `Branch '${t}' is checked out in another worktree of the project, whose files would not follow; nothing was changed. Apply to a branch that is not checked out there.`,
    },
    dirty_tree: {
      recovery: "fix_input",
      say: (_r, t) =>
        `Branch '${t}' is checked out in the project's tree, which has uncommitted work; nothing was changed. Commit, stash or remove it, then retry with the same idempotency_key.`,
    },
    operation_in_progress: {
      recovery: "wait",
      say: (_r, t) =>
        `A merge, rebase, cherry-pick or revert is in progress on branch '${t}' in the project's tree; nothing was changed. Finish or abort it, then retry.`,
    },
    target_moved: {
      recovery: "retry_same",
      say: (_r, t) => `Branch '${t}' moved while the change was being applied; nothing was changed. Retry.`,
    },
    apply_limit: {
      recovery: "none",
      say: (r) =>
        `Run ${r} was already applied under the most idempotency keys the Runner remembers for one run; retry with a key used before.`,
    },
  };

function refusal(runId: string, target: string, r: ApplyRefusal): ApiResult<RunApply> {
  const { recovery, say } = REFUSALS[r.reason];
  let message = say(runId, target);
  const paths = r.paths ?? [];
  if (paths.length > 0) {
    const shown = paths.slice(0, PATHS_IN_MESSAGE).map((p) => JSON.stringify(p));
    const more = paths.length > PATHS_IN_MESSAGE || r.paths_truncated === true ? ", …" : "";
    message += ` Uncommitted: ${shown.join(", ")}${more}.`;
  }
  return {
    ok: false,
    error: {
      code: "apply_refused",
      message,
      recovery_kind: recovery,
      apply_refusal: r.reason,
      ...(r.paths !== undefined ? { paths: r.paths, paths_truncated: r.paths_truncated === true } : {}),
    },
  };
}

export function applyKeyHash(idempotencyKey: string): string {
  return createHash("sha256").update(idempotencyKey, "utf8").digest("hex");
}

export class ChangeApplier {
  readonly #ctx: RunContext;

  constructor(ctx: RunContext) {
    this.#ctx = ctx;
  }

  async apply(principal: Principal, input: ApplyToolInput): Promise<ApiResult<RunApply>> {
    const denied = missingScopes(principal, ["coding_agent:run", "project:write"], "Applying a coding agent's changes");
    if (denied) return { ok: false, error: denied };
    const rec = await this.#ctx.owned(principal, input.run_id, true);
    if (!rec) return fail("not_found", `No run ${input.run_id}.`, "none");
    if (rec.admission !== "admitted" && rec.admission !== "sent") {
      return fail("not_found", `Run ${input.run_id} was never admitted by its Runner: it has no change.`, "none");
    }
    const runner = await this.#ctx.registry.lookup(rec.runner_id);
    if (!runner) {
      return fail("runner_unavailable", "The run's Runner is offline; nothing was changed. Try again later.", "wait");
    }
    const res = await runner.conn.request(
      {
        type: "run.apply",
        run_id: rec.run_id,
        target_branch: input.target_branch,
        key_hash: applyKeyHash(input.idempotency_key),
      },
      APPLY_TIMEOUT_MS,
    );
    if (!res.ok) {
      return fail(
        "runner_unavailable",
        "The run's Runner did not answer in time: the change may or may not have been applied. Retry with the same idempotency_key to learn which.",
        "retry_same",
      );
    }
    const frame = res.frame;
    if (frame.type === "run.apply.result") {
      if (frame.apply && frame.apply.run_id === rec.run_id) return { ok: true, value: frame.apply };
      if (frame.refusal) return refusal(rec.run_id, input.target_branch, frame.refusal);
    }
    if (frame.type === "error") {
      if (frame.code === "idempotency_conflict") {
        return fail(
          "idempotency_conflict",
          `This idempotency_key already applied run ${rec.run_id} into another branch; use a new key for '${input.target_branch}'.`,
          "fix_input",
        );
      }
      if (frame.code === "not_found" || frame.code === "pruned") {
        return fail("not_found", `The Runner keeps no change of run ${rec.run_id} any more.`, "none");
      }
    }
    this.#ctx.log.warn({ run_id: rec.run_id, type: frame.type }, "unexpected answer to run.apply");
    return fail(
      "internal",
      "The Runner could not apply the run's change. Retry with the same idempotency_key.",
      "retry_same",
    );
  }
}
