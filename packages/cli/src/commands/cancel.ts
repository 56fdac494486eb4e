/** `webcodex cancel RUN_ID` (or the TASK_ID of a task-backed start): cancel_coding_agent, idempotent. */
import type { Command } from "../args.js";
import { resolveConnection } from "../args.js";
import type { CliContext } from "../context.js";
import { EXIT } from "../exit-codes.js";
import { renderCancel } from "../render.js";
import { styleFor } from "../style.js";

export async function cancelCommand(cmd: Extract<Command, { name: "cancel" }>, ctx: CliContext): Promise<number> {
  const connection = resolveConnection(cmd.global, ctx.env);
  const style = styleFor(cmd.global.json, ctx.stdout, ctx.env);
  const client = ctx.createClient(connection);
  try {
    const result = await client.cancel((await client.resolveRun?.(cmd.runId)) ?? cmd.runId);
    ctx.stdout.write(renderCancel(result, style));
    return EXIT.ok;
  } finally {
    await client.close();
  }
}
