/**
 * `webcodex session create|update|show`: the workflow-session tools over MCP.
 * `show` prints the handoff and goal (text another run wrote) and the
 * lifecycle evidence entries, every field through terminal-text.ts's
 * escaping (and `--json` through `safeJsonLine`), like the run output.
 */
import { resolveConnection } from "../args.js";
import type { CliContext } from "../context.js";
import { CliError } from "../errors.js";
import { EXIT } from "../exit-codes.js";
import type { SessionAction } from "../session-args.js";
import { SessionRead, SessionResult } from "../session-wire.js";
import type { TaskGlobals } from "../task-args.js";
import { escapeControls, safeJsonLine } from "../terminal-text.js";

/** Everything the Server sent is shown through terminal-text.ts, like the run output. */
const safe = escapeControls;

export async function sessionCommand(global: TaskGlobals, session: SessionAction, ctx: CliContext): Promise<number> {
  const connection = resolveConnection(global, ctx.env);
  const client = ctx.createClient(connection);
  if (!client.callTool) throw new CliError("protocol", "this client cannot call the workflow-session tools");
  const call = client.callTool.bind(client);
  const print = (type: string, value: object, text: string[]) =>
    ctx.stdout.write(global.json ? safeJsonLine({ type, ...value }) : `${text.join("\n")}\n`);
  try {
    switch (session.action) {
      case "create": {
        const r = await call(
          "create_workflow_session",
          { project_id: session.project, title: session.title },
          SessionResult,
        );
        print("session_created", r, [
          `session ${r.session_id} created on project ${r.project_id}`,
          `next: webcodex session update ${r.session_id} --handoff TEXT, or webcodex run --session ${r.session_id} …`,
        ]);
        return EXIT.ok;
      }
      case "update": {
        const stdin = session.handoff === "-" || session.goal === "-" ? await ctx.readStdin() : undefined;
        const text = (value: string | undefined) => (value === "-" ? stdin : value);
        const handoff = text(session.handoff);
        const goal = text(session.goal);
        const r = await call(
          "update_workflow_session",
          {
            session_id: session.sessionId,
            ...(handoff !== undefined ? { handoff } : {}),
            ...(goal !== undefined ? { goal } : {}),
            ...(session.expectedVersion !== undefined ? { expected_version: session.expectedVersion } : {}),
          },
          SessionResult,
        );
        print("session_updated", r, [
          `session ${r.session_id} · version ${r.version} · handoff v${r.handoff_version} · goal v${r.goal_version}`,
        ]);
        return EXIT.ok;
      }
      case "show": {
        const r = await call(
          "read_workflow_session",
          { session_id: session.sessionId, ...(session.after !== undefined ? { after: session.after } : {}) },
          SessionRead,
        );
        const lines = [
          `session ${r.session_id} · project ${r.project_id} · ${safe(r.title)} · version ${r.version}`,
          `goal (v${r.goal_version}): ${r.goal === "" ? "(empty)" : safe(r.goal)}`,
          `handoff (v${r.handoff_version}):${r.handoff === "" ? " (empty)" : `\n${safe(r.handoff)}`}`,
          `evidence${r.evidence_dropped > 0 ? ` (${r.evidence_dropped} older entries dropped)` : ""}:`,
          ...r.evidence.map(
            (e) =>
              `  #${e.seq} ${safe(e.at)} ${safe(e.kind)} ${safe(e.run_id)} · ${safe(e.state)}${e.stop_reason ? ` · ${safe(e.stop_reason)}` : ""}${e.failure_kind ? ` · ${safe(e.failure_kind)}` : ""}`,
          ),
          ...(r.has_more
            ? [`  … more: webcodex session show ${r.session_id} --after ${r.evidence.at(-1)?.seq ?? 0}`]
            : []),
        ];
        print("session", r, lines);
        return EXIT.ok;
      }
      default: {
        const never: never = session;
        return never;
      }
    }
  } finally {
    await client.close();
  }
}
