/**
 * `webcodex task create|attempt|run|reconcile|show|close`: the agent-task
 * tools over MCP, printing the ids a host must keep (task_id, attempt_ref,
 * run_id) and the next command. `show` is reconcile of the current attempt.
 */
import { randomBytes } from "node:crypto";
import { resolveConnection } from "../args.js";
import type { CliContext } from "../context.js";
import { CliError } from "../errors.js";
import { EXIT } from "../exit-codes.js";
import type { RunsClient } from "../server-client.js";
import type { TaskAction, TaskGlobals } from "../task-args.js";
import { AttemptResult, CloseTaskResult, CreateTaskResult, ReconcileResult, TaskRunResult } from "../task-wire.js";

// biome-ignore lint/suspicious/noControlCharactersInRegex: escaping control characters is the point
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/g;
const safe = (s: string) => s.replace(CONTROL, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);

function tools(client: RunsClient): NonNullable<RunsClient["callTool"]> {
  if (!client.callTool) throw new CliError("protocol", "this client cannot call the agent-task tools");
  return client.callTool.bind(client);
}

export async function taskCommand(global: TaskGlobals, task: TaskAction, ctx: CliContext): Promise<number> {
  const connection = resolveConnection(global, ctx.env);
  const client = ctx.createClient(connection);
  const call = tools(client);
  const print = (type: string, value: object, text: string[]) =>
    ctx.stdout.write(global.json ? `${JSON.stringify({ type, ...value })}\n` : `${text.join("\n")}\n`);
  try {
    switch (task.action) {
      case "create": {
        const instruction = task.instruction === "-" ? await ctx.readStdin() : task.instruction;
        const key = task.key ?? `cli-task-${randomBytes(9).toString("base64url")}`;
        const r = await call(
          "create_agent_task",
          {
            project_id: task.project,
            instruction,
            idempotency_key: key,
            ...(task.title !== undefined ? { title: task.title } : {}),
          },
          CreateTaskResult,
        );
        print("task_created", { ...r, key }, [
          `task ${r.task_id} ${r.replayed ? "already existed (same key)" : "created"} on project ${r.project_id}`,
          `key: ${safe(key)}  (the same --key meets the same task)`,
          `next: webcodex task attempt ${r.task_id} --assignee NAME`,
        ]);
        return EXIT.ok;
      }
      case "attempt": {
        const r = await call(
          "start_agent_task_attempt",
          {
            task_id: task.taskId,
            assignee: task.assignee,
            ...(task.leaseSecs !== undefined ? { lease_secs: task.leaseSecs } : {}),
            ...(task.renew !== undefined ? { renew_attempt_ref: task.renew } : {}),
            ...(task.supersede !== undefined ? { supersede_uncertain_run: task.supersede } : {}),
          },
          AttemptResult,
        );
        print("task_attempt", r, [
          `attempt ${r.attempt_id} ${r.renewed ? "renewed" : "started"} for ${safe(r.assignee)} · fence ${r.fence} · generation ${r.controller_generation} · lease until ${r.lease_expires_at}`,
          ...(r.superseded_run_id ? [`superseded lost run ${r.superseded_run_id}`] : []),
          `attempt_ref: ${r.attempt_ref}`,
          `next: webcodex task run --project ID --provider ID --ref ${r.attempt_ref}`,
        ]);
        return EXIT.ok;
      }
      case "run": {
        const r = await call(
          "start_agent_task_coding_run",
          {
            project_id: task.project,
            provider_id: task.provider,
            attempt_ref: task.ref,
            ...(task.timeoutSecs !== undefined ? { timeout_secs: task.timeoutSecs } : {}),
            ...(Object.keys(task.config).length > 0 ? { config: task.config } : {}),
            ...(task.continueRun !== undefined ? { continue_run_id: task.continueRun } : {}),
          },
          TaskRunResult,
        );
        print("task_run", r, [
          `run ${r.run_id} ${r.state}${r.replayed ? " (the attempt's existing run)" : ""} · task ${r.task_id} · attempt ${r.attempt_id}`,
          `next: webcodex observe ${r.run_id} --follow`,
        ]);
        return EXIT.ok;
      }
      case "reconcile":
      case "show": {
        const r = await call(
          "reconcile_agent_task_coding_run",
          {
            task_id: task.taskId,
            ...(task.action === "reconcile" && task.attemptId !== undefined ? { attempt_id: task.attemptId } : {}),
          },
          ReconcileResult,
        );
        const t = r.task;
        const a = r.attempt;
        const lines = [
          `task ${t.task_id} · ${t.state}${t.outcome ? ` (${t.outcome})` : ""} · project ${t.project_id} · attempts ${r.attempts}${t.title ? ` · ${safe(t.title)}` : ""}`,
        ];
        if (a) {
          lines.push(
            `attempt ${a.attempt_id} (${safe(a.assignee)}) · ${a.state} · fence ${a.fence} · generation ${a.controller_generation} · lease ${a.lease_live ? "live" : "expired"} until ${a.lease_expires_at}`,
            `attempt_ref: ${a.attempt_ref}`,
          );
          if (a.run) {
            const detail = [a.run.stop_reason, a.run.failure_kind].filter(Boolean).join(" · ");
            lines.push(
              `run ${a.run.run_id} · ${a.run.state}${detail ? ` · ${detail}` : ""}  (the attempt's run outcome; accepting the work is your call)`,
            );
          } else lines.push("run: none yet");
        } else lines.push("attempt: none yet");
        print(task.action === "show" ? "task" : "task_reconciled", r, lines);
        return EXIT.ok;
      }
      case "close": {
        const r = await call("close_agent_task", { task_id: task.taskId, outcome: task.outcome }, CloseTaskResult);
        print("task_closed", r, [
          `task ${r.task.task_id} ${r.already_closed ? "was already closed" : "closed"}: ${r.task.outcome ?? task.outcome}`,
        ]);
        return EXIT.ok;
      }
      default: {
        const never: never = task;
        return never;
      }
    }
  } finally {
    await client.close();
  }
}
