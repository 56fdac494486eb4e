/**
 * Pure rendering of a run's closing lines: the summary (state · stop reason ·
 * failure kind · execution · duration · run id), the Server's message, and
 * what a person should do next. Like render.ts it writes to no stream and reads
 * no clock; Server text goes through terminal-text.ts (escaped in text mode,
 * JSON-escaped in ndjson).
 */
import { exitCodeForState } from "./exit-codes.js";
import { type RenderState, STATE_ICON, STATE_LABEL, STATE_TONE } from "./render.js";
import { paint, type Style } from "./style.js";
import { escapeDeep, safeJsonLine } from "./terminal-text.js";
import type { Observation, RunEvent } from "./wire.js";

export function formatDuration(ms: number): string {
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)}s`;
  const totalSecs = Math.round(ms / 1000);
  const hours = Math.floor(totalSecs / 3600);
  const mins = Math.floor((totalSecs % 3600) / 60);
  const secs = totalSecs % 60;
  return hours > 0 ? `${hours}h ${String(mins).padStart(2, "0")}m` : `${mins}m ${String(secs).padStart(2, "0")}s`;
}

/** What a person should do next, per terminal state (README "Run states"). */
export function adviceFor(
  obs: Pick<Observation, "run_id" | "state" | "execution_state" | "recovery_kind">,
): string | undefined {
  switch (obs.state) {
    case "completed":
      return undefined;
    case "failed":
      if (obs.execution_state === "not_started") {
        return obs.recovery_kind === "retry_same"
          ? "Nothing ran. Retry the same command with the same --key once the cause is fixed."
          : "Nothing ran. Fix the cause and start a new run.";
      }
      return "The agent ran and the turn failed. Review the project's working tree before starting another run.";
    case "cancelled":
      return obs.execution_state === "not_started"
        ? undefined
        : "The agent stopped. Changes it already made stay in the project's working tree.";
    case "lost":
      return `The outcome cannot be proved: the prompt may have run. Inspect the project (git status, git diff) before deciding; do not simply start it again. Later, \`webcodex observe ${obs.run_id}\` shows whether the Runner reported more.`;
    case "starting":
    case "running":
    case "waiting_permission":
      return `Still in progress: \`webcodex observe ${obs.run_id} --follow\` follows it, \`webcodex cancel ${obs.run_id}\` stops it.`;
    default: {
      const never: never = obs.state;
      return never;
    }
  }
}

/**
 * The closing lines for a run: one summary line (state · stop reason ·
 * failure kind · duration), the Server's fixed message, and advice.
 * `state` is the render state so a streamed paragraph is ended first.
 */
export function renderSummary(
  state: RenderState,
  obs: Observation,
  info: { durationMs?: number | undefined },
  style: Style,
): string {
  if (style.mode === "json") {
    return safeJsonLine({
      type: "summary",
      run_id: obs.run_id,
      state: obs.state,
      execution_state: obs.execution_state,
      stop_reason: obs.stop_reason ?? null,
      failure_kind: obs.failure_kind ?? null,
      recovery_kind: obs.recovery_kind,
      message: obs.message ?? null,
      duration_ms: info.durationMs ?? null,
      usage: obs.usage ?? null,
      exit_code: exitCodeForState(obs.state, obs.failure_kind),
    });
  }
  obs = escapeDeep(obs);
  let text = state.open !== undefined ? "\n" : "";
  const parts = [
    paint(style, "bold", paint(style, STATE_TONE[obs.state], `${STATE_ICON[obs.state]} ${STATE_LABEL[obs.state]}`)),
  ];
  if (obs.stop_reason !== undefined) parts.push(`stop reason ${obs.stop_reason}`);
  if (obs.failure_kind !== undefined) parts.push(obs.failure_kind);
  if (obs.state !== "completed") parts.push(executionLabel(obs.execution_state));
  if (info.durationMs !== undefined) parts.push(formatDuration(info.durationMs));
  const usage = obs.usage === undefined ? "" : formatRunUsage(obs.usage);
  if (usage !== "") parts.push(usage);
  parts.push(paint(style, "dim", obs.run_id));
  text += `${parts.join(" · ")}\n`;
  if (obs.message !== undefined && obs.message !== "") text += `  ${obs.message}\n`;
  const advice = adviceFor(obs);
  if (advice !== undefined) text += `${paint(style, "dim", `  ${advice}`)}\n`;
  return text;
}

/** A token count in a few characters: 950, 12.3k, 200k, 1.5M. */
export function compactCount(n: number): string {
  if (n < 1000) return String(Math.round(n));
  const [value, unit] = n < 1_000_000 ? [n / 1000, "k"] : [n / 1_000_000, "M"];
  return `${value < 100 ? Number(value.toFixed(1)) : Math.round(value)}${unit}`;
}

/** The closing line's usage: "context 12.3k/200k · $0.0042" (any part the agent did not report is left out). */
export function formatRunUsage(usage: NonNullable<Observation["usage"]>): string {
  const parts: string[] = [];
  if (usage.used_tokens != null) {
    const size = usage.context_size != null ? `/${compactCount(usage.context_size)}` : "";
    parts.push(`context ${compactCount(usage.used_tokens)}${size}`);
  }
  if (usage.cost_amount != null) {
    const amount = usage.cost_amount < 1 ? usage.cost_amount.toFixed(4) : usage.cost_amount.toFixed(2);
    const currency = usage.cost_currency;
    parts.push(currency === "USD" ? `$${amount}` : currency != null ? `${amount} ${currency}` : amount);
  }
  return parts.join(" · ");
}

function executionLabel(execution: string): string {
  switch (execution) {
    case "not_started":
      return "prompt not dispatched";
    case "started":
      return "prompt dispatched";
    case "completed":
      return "turn ended";
    case "outcome_unknown":
      return "outcome unknown";
    default:
      return execution;
  }
}

/**
 * A run's duration from its own timestamps, never this client's clock: the Server's `started_at`/`ended_at`
 * (the Runner's admission and terminal event), else its first and terminal events when both were seen.
 * `run` and `observe` print the same number for the same run.
 */
export function runDuration(obs: Observation, events: readonly RunEvent[]): number | undefined {
  if (obs.started_at !== undefined && obs.ended_at !== undefined) {
    const ms = Date.parse(obs.ended_at) - Date.parse(obs.started_at);
    if (Number.isFinite(ms) && ms >= 0) return ms;
  }
  return durationFromEvents(events);
}

/** Derives a run's duration from its own events (seq 1 to the terminal one). */
export function durationFromEvents(events: readonly RunEvent[]): number | undefined {
  const first = events.find((e) => e.seq === 1);
  const last = events.findLast((e) => e.kind === "terminal");
  if (first === undefined || last === undefined) return undefined;
  const ms = Date.parse(last.at) - Date.parse(first.at);
  return Number.isFinite(ms) && ms >= 0 ? ms : undefined;
}
