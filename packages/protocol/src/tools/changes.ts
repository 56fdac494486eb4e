/**
 * The `get_coding_agent_changes` tool's contract (design §16): a worktree run's recorded change, one bounded
 * page at a time. The Server forwards it to the run's Runner (link `run.changes`) and never keeps the answer.
 */
import { z } from "zod";
import { RunId } from "../ids.js";
import {
  ChangesCursor,
  DEFAULT_CHANGES_PAGE_BYTES,
  MAX_CHANGES_PAGE_BYTES,
  MIN_CHANGES_PAGE_BYTES,
  RunChanges,
} from "../workspace.js";

export const CHANGES_TOOL_NAME = "get_coding_agent_changes";

export const ChangesToolInput = z
  .object({
    run_id: RunId,
    cursor: ChangesCursor.optional().describe("The next_cursor of the previous answer; omit for the first page."),
    max_bytes: z
      .number({ error: (issue) => (issue.code === "invalid_type" ? "must be an integer" : undefined) })
      .int({ error: "must be an integer" })
      .min(MIN_CHANGES_PAGE_BYTES)
      .max(MAX_CHANGES_PAGE_BYTES)
      .optional()
      .describe(
        `Most bytes of diff text in this answer (default ${DEFAULT_CHANGES_PAGE_BYTES}, at most ${MAX_CHANGES_PAGE_BYTES}).`,
      ),
  })
  .strict();
export type ChangesToolInput = z.infer<typeof ChangesToolInput>;

export const ChangesToolOutput = RunChanges;
export type ChangesToolOutput = z.infer<typeof ChangesToolOutput>;
