/**
 * Scenarios for the workspace tests and the workspace bench (design §16): an agent that edits a file of its cwd,
 * or writes many, and leaves the edit uncommitted, as an agent does before the Runner records its change.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { z } from "zod";
import { CANCELLED, END_TURN, intParam, type Scenario, say, scenario } from "../turn.js";

/** A relative path inside the cwd: segments of [A-Za-z0-9_.-], none of them `.` or `..`. */
const RelPath = z
  .string()
  .regex(/^[A-Za-z0-9_.-]{1,64}(\/[A-Za-z0-9_.-]{1,64}){0,7}$/, "must be a relative path of [A-Za-z0-9_.-] segments")
  .refine((p) => !p.split("/").some((s) => s === "." || s === ".."), "must not contain . or .. segments");

/**
 * Writes `text` and a newline (`lines` times, default 1) to `path` (relative to the cwd; directories made as needed), uncommitted. Ledger
 * `file_edited` with the path. `hold=true`: then waits for session/cancel (so runs overlap), answering `cancelled`.
 */
/** Most files one `edit_files` turn writes (the workspace bench's 1,000-file change is well inside). */
export const MAX_EDIT_FILES = 20_000;

/** The name of `edit_files`' file number `i`: zero-padded so the files sort in the order they were written. */
export function editFileName(i: number): string {
  return `f${String(i).padStart(5, "0")}.txt`;
}

export const editFile: Scenario = scenario(
  "edit_file path=REL text=TEXT lines=1 hold=true",
  z
    .object({
      path: RelPath,
      text: z.string().max(4096),
      lines: intParam(1, 1, 10_000),
      hold: z.enum(["true", "false"]).default("false"),
    })
    .strict(),
  async (turn, { path, text, lines, hold }) => {
    const file = join(turn.session.cwd, path);
    mkdirSync(dirname(file), { recursive: true });
    writeFileSync(file, `${text}\n`.repeat(lines));
    turn.ledger.append({ event: "file_edited", path });
    await say(turn, `edited ${path}`);
    if (hold !== "true") return END_TURN;
    if (!turn.cancelled.aborted) await new Promise((resolve) => turn.cancelled.addEventListener("abort", resolve));
    return CANCELLED;
  },
);

/**
 * Writes `count` files `DIR/f00000.txt`, `DIR/f00001.txt`, … (relative to the cwd; the directory made as needed),
 * each holding `text`, a space and the file's number, `lines` times, uncommitted: a change of `count` files for
 * the Runner to record. Ledger `files_edited` with the dir and the count.
 */
export const editFiles: Scenario = scenario(
  "edit_files dir=REL count=1000 text=TEXT lines=1",
  z
    .object({
      dir: RelPath,
      count: intParam(1000, 1, MAX_EDIT_FILES),
      text: z.string().max(256).default("changed"),
      lines: intParam(1, 1, 100),
    })
    .strict(),
  async (turn, { dir, count, text, lines }) => {
    const base = join(turn.session.cwd, dir);
    mkdirSync(base, { recursive: true });
    for (let i = 0; i < count; i++) writeFileSync(join(base, editFileName(i)), `${text} ${i}\n`.repeat(lines));
    turn.ledger.append({ event: "files_edited", dir, count });
    await say(turn, `edited ${count} files in ${dir}`);
    return END_TURN;
  },
);
