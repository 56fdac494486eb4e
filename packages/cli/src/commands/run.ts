/**
 * `webcodex run`: start_coding_agent with an idempotency key (and, with `--continue`, the run whose
 * conversation it continues: design §17), then follow the run to its terminal state. First Ctrl-C → cancel_coding_agent and keep
 * following; second Ctrl-C → stop following at once (exit 130).
 */
import { randomBytes } from "node:crypto";
import type { Command } from "../args.js";
import { resolveConnection } from "../args.js";
import type { CliContext } from "../context.js";
import { CliError } from "../errors.js";
import { EXIT, exitCodeForState } from "../exit-codes.js";
import { followRun } from "../follow.js";
import { LiveOutput } from "../live-output.js";
import {
  initialRenderState,
  renderCancel,
  renderError,
  renderObservation,
  renderStarted,
  STATE_LABEL,
} from "../render.js";
import { renderSummary, runDuration } from "../render-summary.js";
import { paint, styleFor } from "../style.js";
import { escapeControls } from "../terminal-text.js";
import { isTerminal, type RunEvent } from "../wire.js";

export function generateKey(): string {
  return `cli-${randomBytes(9).toString("base64url")}`;
}

export async function runCommand(cmd: Extract<Command, { name: "run" }>, ctx: CliContext): Promise<number> {
  const connection = resolveConnection(cmd.global, ctx.env);
  const style = styleFor(cmd.global.json, ctx.stdout, ctx.env);
  const prompt = cmd.prompt === "-" ? await ctx.readStdin() : cmd.prompt;
  if (prompt.trim() === "") throw new CliError("usage", "the prompt read from stdin is empty");
  const key = cmd.key ?? generateKey();
  const client = ctx.createClient(connection);
  const out = new LiveOutput(ctx.stdout, style, { spinner: true });
  const startedAt = Date.now();
  const stopFollowing = new AbortController();
  let runId: string | undefined;
  let interrupts = 0;
  let cancelAsked = false;
  let cancelSent = false;

  const note = (text: string) => {
    if (style.mode === "text") out.write(`${out.atLineStart ? "" : "\n"}${text}\n`);
  };
  const sendCancel = () => {
    if (runId === undefined || cancelSent) return;
    cancelSent = true;
    const id = runId;
    client.cancel(id).then(
      (result) => {
        if (style.mode === "json") out.write(renderCancel(result, style));
        else if (!result.already_terminal)
          note(paint(style, "yellow", "⊘ cancel requested; following until the agent stops"));
      },
      (err: unknown) => {
        const error = err instanceof CliError ? err : new CliError("protocol", String(err));
        out.write(
          renderError(
            {
              code: error.toolCode ?? error.code,
              message: `cancel failed: ${error.message}`,
              hint: `Try \`webcodex cancel ${id}\`.`,
            },
            style,
          ),
        );
      },
    );
  };
  const unregister = ctx.onInterrupt(() => {
    interrupts++;
    if (interrupts === 1) {
      cancelAsked = true;
      note(paint(style, "yellow", "⊘ Ctrl-C: asking the Server to cancel the run (Ctrl-C again stops following)"));
      out.setStatus("cancelling");
      sendCancel();
    } else {
      stopFollowing.abort();
    }
  });

  try {
    out.start(startedAt);
    out.setStatus("starting");
    // A task id names its run; the Server takes only run ids in continue_run_id.
    const continueRunId =
      cmd.continueRun === undefined ? undefined : ((await client.resolveRun?.(cmd.continueRun)) ?? cmd.continueRun);
    const start = await client
      .start(
        {
          project_id: cmd.project,
          provider_id: cmd.provider,
          idempotency_key: key,
          prompt,
          ...(Object.keys(cmd.config).length > 0 ? { config: cmd.config } : {}),
          ...(cmd.timeoutSecs !== undefined ? { timeout_secs: cmd.timeoutSecs } : {}),
          ...(cmd.session !== undefined ? { workflow_session_id: cmd.session } : {}),
          ...(cmd.contextSession !== undefined ? { context_session_id: cmd.contextSession } : {}),
          ...(cmd.contextVersion !== undefined ? { context_session_version: cmd.contextVersion } : {}),
          ...(continueRunId !== undefined ? { continue_run_id: continueRunId } : {}),
        },
        stopFollowing.signal,
      )
      .catch((err: unknown) => {
        if (err instanceof CliError && err.code === "tool" && err.recoveryKind === "retry_same") {
          throw new CliError("tool", err.message, {
            toolCode: err.toolCode,
            recoveryKind: err.recoveryKind,
            hint: `Nothing was started. Retry later with the same key: --key ${key}`,
            cause: err,
          });
        }
        if (err instanceof CliError && err.code !== "tool" && err.code !== "usage") {
          // The request may or may not have reached the Server: the key is the way back.
          throw new CliError(err.code, err.message, {
            hint: `${err.hint ?? ""} Retrying with --key ${key} reattaches to the run if it was started; it never starts a second one.`.trim(),
            cause: err,
          });
        }
        throw err;
      });
    runId = start.run_id;
    out.write(
      renderStarted(
        start,
        {
          project: cmd.project,
          provider: cmd.provider,
          key,
          keyGenerated: cmd.key === undefined,
          ...(continueRunId !== undefined ? { continues: continueRunId } : {}),
        },
        style,
      ),
    );
    if (cancelAsked) sendCancel();

    let rendered = initialRenderState();
    const seen: RunEvent[] = [];
    const final = await followRun({
      client,
      runId: start.run_id,
      token: start.observation_token,
      signal: stopFollowing.signal,
      onObservation: (obs) => {
        seen.push(...obs.events);
        const next = renderObservation(rendered, obs, style);
        rendered = next.state;
        out.setStatus(cancelAsked && !isTerminal(obs.state) ? "cancelling" : STATE_LABEL[obs.state]);
        out.write(next.text);
      },
      onRetry: (err) => note(paint(style, "yellow", `⚠ ${escapeControls(err.message)}; reconnecting…`)),
    });
    out.stop();
    out.write(renderSummary(rendered, final, { durationMs: runDuration(final, seen) }, style));
    return exitCodeForState(final.state, final.failure_kind);
  } catch (err) {
    out.stop();
    if (err instanceof CliError && err.code === "interrupted") {
      const id = runId ?? "(not known yet)";
      if (style.mode === "json") {
        out.write(
          `${JSON.stringify({ type: "interrupted", run_id: runId ?? null, idempotency_key: key, cancel_requested: cancelSent })}\n`,
        );
      } else {
        note(
          paint(
            style,
            "yellow",
            `stopped following ${id}; ${cancelSent ? "the cancel request stands" : "the run goes on"}. Follow it again with \`webcodex observe ${id} --follow\`${runId === undefined ? ` or rerun with --key ${key}` : ""}.`,
          ),
        );
      }
      return EXIT.cancelled;
    }
    if (!out.atLineStart) out.write("\n");
    throw err;
  } finally {
    unregister();
    await client.close();
  }
}
