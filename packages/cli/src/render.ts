/**
 * Pure rendering: observations in, text out. Nothing here writes to a
 * stream, reads a clock or touches the network, so tests replay recorded
 * event streams through exactly the code a live `webcodex run` uses.
 *
 * Text mode streams agent messages as they arrive (consecutive message
 * chunks join into one paragraph), prints one line per tool-activity change,
 * and leaves the final outcome to `renderSummary` (render-summary.ts). JSON
 * mode prints one object per line (ndjson) with a `type` field: started,
 * state, history_lost, event, summary, cancel, project, error.
 *
 * Everything that came from the Server is printed through terminal-text.ts:
 * text mode escapes every control character in it before styling, JSON mode
 * writes JSON escapes (the data stays intact for a JSON reader).
 */
import { paint, type Style, type Tone } from "./style.js";
import { escapeControls, escapeDeep, safeJsonLine } from "./terminal-text.js";
import type { CancelResult, Observation, ProjectView, RunEvent, RunState, StartResult } from "./wire.js";
import { isTerminal, OUTSIDE_PROJECT_PATH } from "./wire.js";

export interface RenderState {
  /** Last run state announced. */
  readonly runState: RunState | undefined;
  readonly offline: boolean;
  /** A streamed text paragraph that has not ended with a newline yet. */
  readonly open: "agent_message" | "reasoning" | undefined;
  /** Highest event seq rendered; older or repeated events are skipped. */
  readonly lastSeq: number;
  /** tool_call_id → last rendered "status title", so repeats print nothing. */
  readonly tools: ReadonlyMap<string, string>;
}

export interface Rendered {
  readonly state: RenderState;
  /** Text to write as-is; may end mid-line while a message streams. */
  readonly text: string;
}

export function initialRenderState(): RenderState {
  return { runState: undefined, offline: false, open: undefined, lastSeq: 0, tools: new Map() };
}

export const STATE_LABEL: Record<RunState, string> = {
  starting: "starting",
  running: "running",
  waiting_permission: "waiting for permission",
  completed: "completed",
  failed: "failed",
  cancelled: "cancelled",
  lost: "lost",
};

/** Shared with render-summary.ts, which prints the same state badge on the closing line. */
export const STATE_TONE: Record<RunState, Tone> = {
  starting: "cyan",
  running: "cyan",
  waiting_permission: "yellow",
  completed: "green",
  failed: "red",
  cancelled: "yellow",
  lost: "magenta",
};

export const STATE_ICON: Record<RunState, string> = {
  starting: "●",
  running: "●",
  waiting_permission: "●",
  completed: "✔",
  failed: "✖",
  cancelled: "⊘",
  lost: "?",
};

function json(value: Record<string, unknown>): string {
  return safeJsonLine(value);
}

/** The first lines of `webcodex run`: which run, and the key that reattaches to it. */
export function renderStarted(
  start: StartResult,
  meta: { project: string; provider: string; key: string; keyGenerated: boolean; continues?: string },
  style: Style,
): string {
  if (style.mode === "json") {
    const { observation_token: _token, ...rest } = start;
    return json({
      type: "started",
      ...rest,
      project_id: meta.project,
      provider_id: meta.provider,
      idempotency_key: meta.key,
      ...(meta.continues !== undefined ? { continue_run_id: meta.continues } : {}),
    });
  }
  start = escapeDeep(start);
  meta = escapeDeep(meta);
  const head = start.replayed
    ? `${paint(style, "bold", "↺ reattached to")} ${start.run_id} ${paint(style, "dim", "(this key already started it; nothing new was dispatched)")}`
    : `${paint(style, "bold", "▸ run")} ${start.run_id} ${paint(style, "dim", `· project ${meta.project} · provider ${meta.provider}`)}`;
  const keyLine = meta.keyGenerated
    ? paint(
        style,
        "dim",
        `  key ${meta.key} — if this command is interrupted, rerun it with --key ${meta.key} to reattach`,
      )
    : paint(style, "dim", `  key ${meta.key}`);
  const continues =
    meta.continues === undefined
      ? ""
      : `${paint(style, "dim", `  continues ${meta.continues} (the agent resumes that run's session)`)}\n`;
  return `${head}\n${continues}${keyLine}\n`;
}

/** Renders everything new in one observation and returns the advanced state. */
export function renderObservation(state: RenderState, obs: Observation, style: Style): Rendered {
  return style.mode === "json" ? renderObservationJson(state, obs) : renderObservationText(state, obs, style);
}

function renderObservationJson(state: RenderState, obs: Observation): Rendered {
  let text = "";
  let lastSeq = obs.history_lost ? 0 : state.lastSeq;
  if (obs.history_lost) text += json({ type: "history_lost", run_id: obs.run_id });
  const offline = obs.runner_offline === true;
  const stateLine =
    obs.state !== state.runState || offline !== state.offline
      ? json({
          type: "state",
          run_id: obs.run_id,
          state: obs.state,
          execution_state: obs.execution_state,
          ...(offline ? { runner_offline: true } : {}),
        })
      : "";
  // A state the run entered comes before the events that happened in it; a terminal state comes after the
  // run's last events, as it does in the run itself.
  const terminal = isTerminal(obs.state);
  if (!terminal) text += stateLine;
  for (const event of obs.events) {
    if (event.seq <= lastSeq) continue;
    lastSeq = event.seq;
    if (event.kind === "other") {
      text += json({ type: "event", run_id: obs.run_id, seq: event.seq, at: event.at, kind: event.original_kind });
    } else {
      text += json({ type: "event", run_id: obs.run_id, ...event });
    }
  }
  if (terminal) text += stateLine;
  return { state: { ...state, runState: obs.state, offline, lastSeq }, text };
}

function renderObservationText(state: RenderState, raw: Observation, style: Style): Rendered {
  const obs = escapeDeep(raw);
  let open = state.open;
  let text = "";
  /** Ends a streamed paragraph before a line of another kind. */
  const line = (content: string) => {
    if (open !== undefined) {
      text += "\n";
      open = undefined;
    }
    text += `${content}\n`;
  };

  let lastSeq = state.lastSeq;
  if (obs.history_lost) {
    line(
      paint(
        style,
        "dim",
        "  (earlier events of this run are no longer available: the Runner restarted or no longer keeps them)",
      ),
    );
    lastSeq = 0;
  }

  const offline = obs.runner_offline === true;
  if (offline && !state.offline) {
    line(
      paint(
        style,
        "yellow",
        "⚠ the run's Runner is offline — showing its last known state; waiting for it to reconnect",
      ),
    );
  } else if (!offline && state.offline) {
    line(paint(style, "dim", "  the Runner is back online"));
  }

  if (obs.state !== state.runState && !isTerminal(obs.state)) {
    line(paint(style, STATE_TONE[obs.state], `${STATE_ICON[obs.state]} ${STATE_LABEL[obs.state]}`));
  }

  const tools = new Map(state.tools);
  for (const event of obs.events) {
    if (event.seq <= lastSeq) continue;
    lastSeq = event.seq;
    switch (event.kind) {
      case "agent_message": {
        if (open === "reasoning") {
          text += "\n";
          open = undefined;
        }
        if (open === undefined && text.length > 0 && !text.endsWith("\n")) text += "\n";
        text += event.text;
        if (event.truncated === true) text += paint(style, "dim", " […]");
        open = text.endsWith("\n") ? undefined : "agent_message";
        break;
      }
      case "reasoning": {
        if (open !== "reasoning") {
          if (open !== undefined) text += "\n";
          text += paint(style, "dim", "thinking: ");
        }
        text += paint(style, "dim", event.text);
        if (event.truncated === true) text += paint(style, "dim", " […]");
        open = text.endsWith("\n") ? undefined : "reasoning";
        break;
      }
      case "plan": {
        line(paint(style, "bold", "plan"));
        for (const entry of event.entries) {
          const mark =
            entry.status === "completed"
              ? paint(style, "green", "✓")
              : entry.status === "in_progress"
                ? paint(style, "cyan", "▸")
                : paint(style, "gray", "○");
          line(`  ${mark} ${oneLine(entry.content)}`);
        }
        if (event.truncated === true) line(paint(style, "dim", "  […]"));
        break;
      }
      case "tool_activity": {
        const signature = `${event.status} ${event.title}`;
        if (tools.get(event.tool_call_id) === signature) break;
        tools.set(event.tool_call_id, signature);
        const kind =
          event.tool_kind !== undefined && event.tool_kind !== "other"
            ? paint(style, "dim", ` · ${event.tool_kind}`)
            : "";
        line(`  ${toolIcon(event.status, style)} ${oneLine(event.title)}${kind}`);
        break;
      }
      case "file_change":
        line(
          `  ${paint(style, "yellow", "✎")} ${
            event.path === OUTSIDE_PROJECT_PATH
              ? paint(style, "dim", "(a file outside the project root; the Runner withholds its path)")
              : event.path
          }`,
        );
        break;
      case "terminal_activity":
        line(paint(style, "dim", `  ▸ terminal ${event.terminal_id}`));
        break;
      case "usage": {
        const usage = formatUsage(event);
        if (usage !== "") line(paint(style, "dim", `  usage: ${usage}`));
        break;
      }
      case "permission_request": {
        line(`  ${paint(style, "yellow", "?")} permission requested: ${oneLine(event.title)}`);
        if (event.options.length > 0) {
          line(paint(style, "dim", `    options offered: ${event.options.map((o) => o.name).join(", ")}`));
        }
        line(
          paint(
            style,
            "dim",
            "    WebCodex never grants permissions; the run waits for its permission deadline or a cancel",
          ),
        );
        break;
      }
      case "agent_state": {
        const described = describeAgentState(event);
        if (described !== undefined) line(paint(style, described.tone, described.text));
        break;
      }
      case "terminal":
        // The outcome is printed once, by renderSummary, from the final observation.
        break;
      case "other":
        line(paint(style, "dim", `  · ${event.original_kind}`));
        break;
      default: {
        const never: never = event;
        return never;
      }
    }
  }
  return { state: { runState: obs.state, offline, open, lastSeq, tools }, text };
}

/**
 * One line per agent-state change: the mode and config changes an operator
 * must notice (a mode that asks for permissions stalls a run), the session
 * title, and how many commands the agent offers (their names only in JSON).
 */
function describeAgentState(
  event: Extract<RunEvent, { kind: "agent_state" }>,
): { tone: Tone; text: string } | undefined {
  const more = event.truncated === true ? " …" : "";
  switch (event.change) {
    case "mode":
      return event.mode_id === undefined ? undefined : { tone: "cyan", text: `  ⚙ mode → ${oneLine(event.mode_id)}` };
    case "config_options": {
      const options = event.config_options ?? [];
      if (options.length === 0) return undefined;
      const list = options.map((o) => `${oneLine(o.id)}=${oneLine(String(o.value))}`).join(" · ");
      return { tone: "cyan", text: `  ⚙ config: ${list}${more}` };
    }
    case "session_info":
      return event.title === undefined ? undefined : { tone: "dim", text: `  · session: ${oneLine(event.title)}` };
    case "commands": {
      const count = event.commands?.length ?? 0;
      return {
        tone: "dim",
        text: `  · ${count}${more === "" ? "" : "+"} agent command${count === 1 ? "" : "s"} available`,
      };
    }
    default:
      return { tone: "dim", text: `  · agent state: ${oneLine(event.change)}` };
  }
}

function toolIcon(status: string, style: Style): string {
  switch (status) {
    case "pending":
      return paint(style, "gray", "○");
    case "in_progress":
      return paint(style, "cyan", "◐");
    case "completed":
      return paint(style, "green", "✓");
    case "failed":
      return paint(style, "red", "✗");
    default:
      return paint(style, "gray", "·");
  }
}

function oneLine(text: string): string {
  return text.replace(/\s*\n\s*/g, " ").trim();
}

const number = new Intl.NumberFormat("en-US");

function formatUsage(event: Extract<RunEvent, { kind: "usage" }>): string {
  const parts: string[] = [];
  if (event.used_tokens !== undefined) {
    parts.push(
      event.context_size !== undefined
        ? `${number.format(event.used_tokens)} / ${number.format(event.context_size)} tokens`
        : `${number.format(event.used_tokens)} tokens`,
    );
  }
  if (event.cost_amount !== undefined) {
    parts.push(`${event.cost_amount.toFixed(4)}${event.cost_currency !== undefined ? ` ${event.cost_currency}` : ""}`);
  }
  return parts.join(" · ");
}

export function renderCancel(result: CancelResult, style: Style): string {
  if (style.mode === "json") return json({ type: "cancel", ...result });
  result = escapeDeep(result);
  if (result.already_terminal) {
    return `${result.run_id} is already ${STATE_LABEL[result.state]}; nothing to cancel\n`;
  }
  return `${paint(style, "yellow", "⊘")} cancel requested for ${result.run_id} (now ${STATE_LABEL[result.state]}); \`webcodex observe ${result.run_id} --follow\` shows when it stops\n`;
}

export function renderProjects(projects: readonly ProjectView[], server: string, style: Style): string {
  if (style.mode === "json") {
    return projects.map((p) => json({ type: "project", ...p })).join("");
  }
  projects = escapeDeep(projects);
  let text = `${paint(style, "bold", "Server")} ${escapeControls(server)} · ${projects.length} project${projects.length === 1 ? "" : "s"} visible to this token\n`;
  if (projects.length === 0) {
    text += paint(style, "dim", "  (none: ask the operator to grant this token a project)\n");
  }
  for (const project of projects) {
    const online = project.runner_online
      ? paint(style, "green", "runner online")
      : paint(style, "red", "runner offline");
    const patch =
      project.allow_patch === undefined
        ? ""
        : project.allow_patch
          ? " · runs allowed"
          : ` · ${paint(style, "yellow", "read-only (allow_patch = false)")}`;
    const shared =
      project.agents_share_runner_user === true
        ? ` · ${paint(style, "yellow", "agents run as the Runner's user (agents_share_runner_user)")}`
        : "";
    text += `\n${paint(style, "bold", project.project_id)}  ${online}${patch}${shared}\n`;
    if (project.providers.length === 0) {
      text += paint(
        style,
        "dim",
        project.runner_online ? "  no providers advertised\n" : "  providers appear when the Runner connects\n",
      );
    }
    for (const provider of project.providers) {
      const config =
        provider.allowed_config_options.length > 0
          ? paint(style, "dim", `  config: ${provider.allowed_config_options.join(", ")}`)
          : "";
      text += `  ${provider.provider_id.padEnd(12)} ${provider.name}${config}\n`;
    }
  }
  return text;
}

export function renderError(
  error: { code: string; message: string; hint?: string | undefined; recovery_kind?: string | undefined },
  style: Style,
): string {
  if (style.mode === "json") {
    return json({
      type: "error",
      code: error.code,
      message: error.message,
      ...(error.hint !== undefined ? { hint: error.hint } : {}),
      ...(error.recovery_kind !== undefined ? { recovery_kind: error.recovery_kind } : {}),
    });
  }
  const hint = error.hint !== undefined ? `\n${paint(style, "dim", `  ${escapeControls(error.hint)}`)}` : "";
  return `${paint(style, "red", "error:")} ${escapeControls(error.message)}${hint}\n`;
}
