/** `webcodex status`: the webcodex://projects resource, as this token sees it. */
import type { Command } from "../args.js";
import { resolveConnection } from "../args.js";
import type { CliContext } from "../context.js";
import { EXIT } from "../exit-codes.js";
import { renderProjects } from "../render.js";
import { styleFor } from "../style.js";

export async function statusCommand(cmd: Extract<Command, { name: "status" }>, ctx: CliContext): Promise<number> {
  const connection = resolveConnection(cmd.global, ctx.env);
  const style = styleFor(cmd.global.json, ctx.stdout, ctx.env);
  const client = ctx.createClient(connection);
  try {
    const projects = await client.projects();
    ctx.stdout.write(renderProjects(projects, connection.url, style));
    return EXIT.ok;
  } finally {
    await client.close();
  }
}
