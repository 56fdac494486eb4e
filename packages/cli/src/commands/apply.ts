/**
 * `webcodex apply RUN_ID --to BRANCH [--key K]`: apply_coding_agent_changes — bring an ended worktree run's change
 * into BRANCH (fast-forward or a clean merge; never forced, never over uncommitted work). Without --key a random
 * key is made and printed: the same --key again gets the same answer. Exits 1 on a conflict (nothing changed).
 */
import { randomBytes } from "node:crypto";
import { APPLY_TIMEOUT_MS } from "@webcodex/protocol";
import type { Command } from "../args.js";
import { resolveConnection } from "../args.js";
import { ApplyResult } from "../changes-wire.js";
import type { CliContext } from "../context.js";
import { CliError } from "../errors.js";
import { EXIT } from "../exit-codes.js";
import { renderApply } from "../render-changes.js";
import { styleFor } from "../style.js";

/** The CLI waits for the Server's whole bound on the Runner's apply, and this much more for the answer's way back. */
export const APPLY_ANSWER_MARGIN_MS = 30_000;

export async function applyCommand(cmd: Extract<Command, { name: "apply" }>, ctx: CliContext): Promise<number> {
  const connection = resolveConnection(cmd.global, ctx.env);
  const style = styleFor(cmd.global.json, ctx.stdout, ctx.env);
  const client = ctx.createClient(connection);
  try {
    if (!client.callTool) throw new CliError("protocol", "this client cannot call apply_coding_agent_changes");
    const runId = (await client.resolveRun?.(cmd.runId)) ?? cmd.runId;
    const key = cmd.key ?? `cli-apply-${randomBytes(9).toString("base64url")}`;
    const result = await client.callTool(
      "apply_coding_agent_changes",
      { run_id: runId, target_branch: cmd.to, idempotency_key: key },
      ApplyResult,
      APPLY_TIMEOUT_MS + APPLY_ANSWER_MARGIN_MS,
    );
    ctx.stdout.write(renderApply(result, key, style));
    return result.result === "conflict" ? EXIT.failed : EXIT.ok;
  } finally {
    await client.close();
  }
}
