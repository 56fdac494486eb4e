/**
 * `webcodex changes RUN_ID [--patch]`: get_coding_agent_changes — a worktree run's recorded change, its files and
 * (with --patch) the whole unified diff, page after page (bounded: MAX_PATCH_PAGES).
 */
import { MAX_CHANGE_DIFF_BYTES, MAX_CHANGES_PAGE_BYTES } from "@webcodex/protocol";
import type { Command } from "../args.js";
import { resolveConnection } from "../args.js";
import { ChangesResult } from "../changes-wire.js";
import type { CliContext } from "../context.js";
import { CliError } from "../errors.js";
import { EXIT } from "../exit-codes.js";
import { renderChanges, renderDiffPage, renderDiffTruncated } from "../render-changes.js";
import { styleFor } from "../style.js";

/** Most pages one `--patch` reads: a page is cut at a line end, so it holds at least half of MAX_CHANGES_PAGE_BYTES. */
export const MAX_PATCH_PAGES = 2 * Math.ceil(MAX_CHANGE_DIFF_BYTES / MAX_CHANGES_PAGE_BYTES) + 1;

export async function changesCommand(cmd: Extract<Command, { name: "changes" }>, ctx: CliContext): Promise<number> {
  const connection = resolveConnection(cmd.global, ctx.env);
  const style = styleFor(cmd.global.json, ctx.stdout, ctx.env);
  const client = ctx.createClient(connection);
  try {
    if (!client.callTool) throw new CliError("protocol", "this client cannot call get_coding_agent_changes");
    const runId = (await client.resolveRun?.(cmd.runId)) ?? cmd.runId;
    const page = (cursor?: string) =>
      client.callTool?.(
        "get_coding_agent_changes",
        { run_id: runId, max_bytes: MAX_CHANGES_PAGE_BYTES, ...(cursor !== undefined ? { cursor } : {}) },
        ChangesResult,
      ) as Promise<ChangesResult>;
    let changes = await page();
    ctx.stdout.write(renderChanges(changes, style));
    if (!cmd.patch || !changes.recorded) return EXIT.ok;
    for (let pages = 1; ; pages++) {
      ctx.stdout.write(renderDiffPage(changes, style));
      const next = changes.next_cursor;
      if (next === undefined || pages >= MAX_PATCH_PAGES) break;
      changes = await page(next);
    }
    if (changes.diff_truncated) ctx.stdout.write(renderDiffTruncated(style));
    return EXIT.ok;
  } finally {
    await client.close();
  }
}
