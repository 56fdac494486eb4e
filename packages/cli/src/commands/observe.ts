/**
 * `webcodex observe RUN_ID [--follow]` (or the TASK_ID of a task-backed start): one snapshot (the Server's bounded
 * baseline, drained while has_more) or, with --follow, everything until the
 * run ends. Ctrl-C stops following; the run goes on.
 */
import type { Command } from "../args.js";
import { resolveConnection } from "../args.js";
import type { CliContext } from "../context.js";
import { CliError } from "../errors.js";
import { EXIT, exitCodeForState } from "../exit-codes.js";
import { followRun } from "../follow.js";
import { LiveOutput } from "../live-output.js";
import { initialRenderState, renderObservation, STATE_LABEL } from "../render.js";
import { renderSummary, runDuration } from "../render-summary.js";
import { paint, styleFor } from "../style.js";
import { escapeControls } from "../terminal-text.js";
import type { Observation, RunEvent } from "../wire.js";

export async function observeCommand(cmd: Extract<Command, { name: "observe" }>, ctx: CliContext): Promise<number> {
  const connection = resolveConnection(cmd.global, ctx.env);
  const style = styleFor(cmd.global.json, ctx.stdout, ctx.env);
  const client = ctx.createClient(connection);
  const out = new LiveOutput(ctx.stdout, style, { spinner: cmd.follow });
  const stop = new AbortController();
  const unregister = ctx.onInterrupt(() => stop.abort());
  const seen: RunEvent[] = [];
  let rendered = initialRenderState();
  const show = (obs: Observation) => {
    seen.push(...obs.events);
    // The spinner counts the run's own time, from its first event, not the time spent following it.
    const first = obs.events.find((e) => e.seq === 1);
    if (cmd.follow && first !== undefined) out.start(Date.parse(first.at));
    const next = renderObservation(rendered, obs, style);
    rendered = next.state;
    out.setStatus(STATE_LABEL[obs.state]);
    out.write(next.text);
  };
  try {
    const runId = (await client.resolveRun?.(cmd.runId)) ?? cmd.runId;
    let final: Observation;
    if (cmd.follow) {
      out.start();
      final = await followRun({
        client,
        runId,
        signal: stop.signal,
        onObservation: show,
        onRetry: (err) => {
          if (style.mode === "text")
            out.write(
              `${out.atLineStart ? "" : "\n"}${paint(style, "yellow", `⚠ ${escapeControls(err.message)}; reconnecting…`)}\n`,
            );
        },
      });
    } else {
      let obs = await client.observe({ run_id: runId, wait_secs: 0 }, stop.signal);
      // A snapshot prints the state once, in the summary line.
      if (style.mode === "text") rendered = { ...rendered, runState: obs.state };
      show(obs);
      while (obs.has_more) {
        obs = await client.observe(
          { run_id: runId, after_observation_token: obs.observation_token, wait_secs: 0 },
          stop.signal,
        );
        show(obs);
      }
      final = obs;
    }
    out.stop();
    out.write(renderSummary(rendered, final, { durationMs: runDuration(final, seen) }, style));
    return exitCodeForState(final.state, final.failure_kind);
  } catch (err) {
    out.stop();
    if (err instanceof CliError && err.code === "interrupted") {
      if (style.mode === "text") {
        out.write(
          `${out.atLineStart ? "" : "\n"}${paint(style, "dim", `stopped following ${cmd.runId}; the run goes on`)}\n`,
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
