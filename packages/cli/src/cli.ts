/**
 * `runCli(argv, ctx)` → exit code. Parses the command, runs it, and prints
 * any error once: what failed and what to check (ndjson `error` objects on
 * stdout with --json).
 */
import { parseCommand } from "./args.js";
import { applyCommand } from "./commands/apply.js";
import { cancelCommand } from "./commands/cancel.js";
import { changesCommand } from "./commands/changes.js";
import { observeCommand } from "./commands/observe.js";
import { runCommand } from "./commands/run.js";
import { sessionCommand } from "./commands/session.js";
import { statusCommand } from "./commands/status.js";
import { taskCommand } from "./commands/task.js";
import type { CliContext } from "./context.js";
import { CliError } from "./errors.js";
import { EXIT } from "./exit-codes.js";
import { commandHelp, USAGE } from "./help.js";
import { renderError } from "./render.js";
import { JSON_STYLE, styleFor } from "./style.js";

export const VERSION = "0.1.0";

export async function runCli(argv: readonly string[], ctx: CliContext): Promise<number> {
  const json = argv.includes("--json");
  try {
    const cmd = parseCommand(argv);
    switch (cmd.name) {
      case "help":
        ctx.stdout.write(cmd.topic === undefined ? USAGE : commandHelp(cmd.topic));
        return EXIT.ok;
      case "version":
        ctx.stdout.write(`webcodex ${VERSION}\n`);
        return EXIT.ok;
      case "run":
        return await runCommand(cmd, ctx);
      case "observe":
        return await observeCommand(cmd, ctx);
      case "cancel":
        return await cancelCommand(cmd, ctx);
      case "changes":
        return await changesCommand(cmd, ctx);
      case "apply":
        return await applyCommand(cmd, ctx);
      case "status":
        return await statusCommand(cmd, ctx);
      case "task":
        return await taskCommand(cmd.global, cmd.task, ctx);
      case "task-help":
        ctx.stdout.write(commandHelp("task"));
        return EXIT.ok;
      case "session":
        return await sessionCommand(cmd.global, cmd.session, ctx);
      case "session-help":
        ctx.stdout.write(commandHelp("session"));
        return EXIT.ok;
      default: {
        const never: never = cmd;
        return never;
      }
    }
  } catch (err) {
    const error =
      err instanceof CliError
        ? err
        : new CliError("protocol", `unexpected error: ${err instanceof Error ? err.message : String(err)}`);
    const target = json ? ctx.stdout : ctx.stderr;
    const style = json ? JSON_STYLE : styleFor(false, ctx.stderr, ctx.env);
    target.write(
      renderError(
        {
          code: error.toolCode ?? error.code,
          message: error.message,
          hint: error.hint,
          ...(error.recoveryKind !== undefined ? { recovery_kind: error.recoveryKind } : {}),
        },
        style,
      ),
    );
    return error.exitCode;
  }
}
