/**
 * How `webcodex changes` and `webcodex apply` print (design §16). A change is project content from the Server:
 * every string goes through terminal-text.ts before it is printed, the diff included, so a file's text cannot
 * drive the terminal.
 */
import type { ApplyResult, ChangesResult } from "./changes-wire.js";
import { paint, type Style } from "./style.js";
import { escapeControls, escapeDeep, safeJsonLine } from "./terminal-text.js";

const STATUS_MARK: Record<string, string> = { added: "A", modified: "M", deleted: "D", renamed: "R" };
const short = (commit: string | undefined) => (commit ?? "").slice(0, 12);

/** The header and file list of a change (its first page). */
export function renderChanges(changes: ChangesResult, style: Style): string {
  if (style.mode === "json") {
    const { diff: _diff, next_cursor: _next, ...rest } = changes;
    return safeJsonLine({ type: "changes", ...rest });
  }
  const c = escapeDeep(changes);
  if (!c.recorded) {
    return `${c.run_id} has not ended yet: its change is recorded on ${c.branch} when it ends (base ${short(c.base_commit)}). Ask again once it ended.\n`;
  }
  let text = `${paint(style, "bold", c.run_id)} · ${c.branch} · base ${short(c.base_commit)} → head ${short(c.head_commit)}\n`;
  if (c.files.length === 0) text += paint(style, "dim", "  (no change: the head is the base)\n");
  const width = Math.min(
    60,
    Math.max(0, ...c.files.map((f) => f.path.length + (f.old_path ? f.old_path.length + 3 : 0))),
  );
  let insertions = 0;
  let deletions = 0;
  for (const f of c.files) {
    const name = f.old_path ? `${f.old_path} → ${f.path}` : f.path;
    const counts = f.binary
      ? "binary"
      : `${paint(style, "green", `+${f.insertions}`)} ${paint(style, "red", `-${f.deletions}`)}`;
    text += `  ${STATUS_MARK[f.status] ?? f.status} ${name.padEnd(width)}  ${counts}\n`;
    insertions += f.insertions;
    deletions += f.deletions;
  }
  const more = c.files_truncated ? " (more files changed than listed)" : "";
  text += `${c.files.length} file${c.files.length === 1 ? "" : "s"} changed, +${insertions} -${deletions}${more}\n`;
  return text;
}

/** One page of the unified diff (`--patch`). */
export function renderDiffPage(changes: ChangesResult, style: Style): string {
  if (style.mode === "json") return safeJsonLine({ type: "diff", run_id: changes.run_id, text: changes.diff });
  return escapeControls(changes.diff);
}

export function renderDiffTruncated(style: Style): string {
  if (style.mode === "json") return safeJsonLine({ type: "diff_truncated" });
  return paint(style, "yellow", "(the diff is longer than the Runner pages through: it stops here)\n");
}

export function renderApply(result: ApplyResult, key: string, style: Style): string {
  if (style.mode === "json") return safeJsonLine({ type: "apply", ...result, key });
  const r = escapeDeep(result);
  const keyLine = `key: ${escapeControls(key)}  (the same --key gets the same answer)\n`;
  switch (r.result) {
    case "fast_forward":
      return `${paint(style, "green", "✓")} ${r.target_branch} fast-forwarded to ${short(r.target_after)} (run ${r.run_id})\n${keyLine}`;
    case "merged":
      return `${paint(style, "green", "✓")} run ${r.run_id} merged into ${r.target_branch}: merge commit ${short(r.target_after)} (was ${short(r.target_before)})\n${keyLine}`;
    case "up_to_date":
      return `${r.target_branch} already contains run ${r.run_id}'s change (at ${short(r.target_after)}); nothing to do\n${keyLine}`;
    case "conflict": {
      const paths = (r.conflicts ?? []).map((p) => `  ${p}\n`).join("");
      const more = r.conflicts_truncated ? "  …\n" : "";
      return `${paint(style, "red", "✗")} run ${r.run_id} does not merge cleanly into ${r.target_branch}; nothing was changed. Conflicting paths:\n${paths}${more}${keyLine}`;
    }
    default:
      return `${r.target_branch}: ${r.result} (run ${r.run_id})\n${keyLine}`;
  }
}
