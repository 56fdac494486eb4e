/**
 * A scenario for the workspace tests (design §16): an agent that edits a file of its cwd and leaves the edit
 * uncommitted, as an agent does before the Runner records its change.
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
