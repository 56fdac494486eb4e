/**
 * The `apply_coding_agent_changes` tool's contract (design §16): bring a worktree run's recorded change into a
 * branch of its project — fast-forward, or a merge commit when it merges cleanly; never forced, never over
 * uncommitted work; a conflict changes nothing and names the paths. The Server forwards it to the run's Runner
 * (link `run.apply`), which remembers the answer under the idempotency key.
 */
import { z } from "zod";
import { RunId } from "../ids.js";
import { RunApply, TargetBranch } from "../workspace.js";
import { OpaqueKey } from "./runs.js";

export const APPLY_TOOL_NAME = "apply_coding_agent_changes";

export const ApplyToolInput = z
  .object({
    run_id: RunId,
    target_branch: TargetBranch,
    idempotency_key: OpaqueKey.describe(
      "Your key for this apply: the same key again (after a timeout, a restart) gets the same answer and never " +
        "applies twice. A refusal is not remembered: fix its cause and retry with the same key.",
    ),
  })
  .strict();
export type ApplyToolInput = z.infer<typeof ApplyToolInput>;

export const ApplyToolOutput = RunApply;
export type ApplyToolOutput = z.infer<typeof ApplyToolOutput>;
