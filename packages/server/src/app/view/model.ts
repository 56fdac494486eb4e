/**
 * What the run view knows about its run, folded from observe results (no DOM here; view.ts draws it).
 *
 * Agent text is hostile input (design §4.5): it is only ever kept as strings and drawn with `textContent`.
 * As in the CLI, terminal controls and bidi controls in it become visible escapes (`\x1b`), and a file path
 * that is not relative to the project is shown as "<outside project>", never as the path.
 */

export type RunState = "starting" | "running" | "waiting_permission" | "completed" | "failed" | "cancelled" | "lost";
export type StepStatus = "pending" | "running" | "done" | "failed" | "waiting";

export const TERMINAL_STATES: ReadonlySet<string> = new Set(["completed", "failed", "cancelled", "lost"]);
/** Messages kept on the page; older paragraphs are dropped first. */
export const MAX_MESSAGE_BLOCKS = 200;
/** Characters kept per message paragraph; the start of a longer one is dropped. */
export const MAX_MESSAGE_CHARS = 64 * 1024;
/** Tool steps kept on the page (the earliest are dropped). */
export const MAX_STEPS = 500;
/** Changed files listed (further ones are counted, not listed). */
export const MAX_FILES = 500;
/** How a path outside the project is shown (the Runner already masks such paths the same way). */
export const OUTSIDE_PROJECT = "<outside project>";
/** Diff bytes the view asks get_coding_agent_changes for (one page; the Server's default page). */
export const CHANGES_PAGE_BYTES = 64 * 1024;
/** Characters of the diff drawn at most (the page is already bounded; this bounds what reaches the page). */
export const MAX_DIFF_CHARS = 64 * 1024;
/** Files of a recorded change listed (further ones are counted, not listed). */
export const MAX_CHANGE_FILES = 500;

export interface Step {
  id: string;
  title: string;
  kind: string;
  status: StepStatus;
}

export interface Usage {
  usedTokens: number | null;
  contextSize: number | null;
  costAmount: number | null;
  costCurrency: string | null;
}

export interface PlanEntry {
  content: string;
  status: string;
}

/** One file of a worktree run's recorded change (get_coding_agent_changes), as shown. */
export interface ChangeFile {
  path: string;
  oldPath: string | null;
  status: string;
  insertions: number;
  deletions: number;
  binary: boolean;
}

/** A worktree run's recorded change: the files and the first page of its diff, as text. */
export interface ChangesModel {
  recorded: boolean;
  branch: string;
  files: ChangeFile[];
  /** Files changed but not listed (the Server's or the view's bound). */
  filesNotListed: boolean;
  diff: string;
  /** The diff goes on past what is drawn (another page, the Runner's bound, or MAX_DIFF_CHARS). */
  diffCut: boolean;
}

export interface RunModel {
  runId: string | null;
  /** The run this one continues, and the run that continued it (design §17), as observe names them. */
  parentRunId: string | null;
  continuedBy: string | null;
  /** A worktree run's branch (design §16), from observe; null: the run works in the project's tree. */
  branch: string | null;
  project: string | null;
  provider: string | null;
  state: RunState | null;
  executionState: string | null;
  stopReason: string | null;
  failureKind: string | null;
  recoveryKind: string | null;
  runnerOffline: boolean;
  historyLost: boolean;
  /** Epoch ms of the run's first event (or of when the view first saw it), and of its terminal event. */
  startedAt: number | null;
  endedAt: number | null;
  lastSeq: number;
  /** Paragraphs of agent text; `open` says whether the next chunk continues the last one. */
  messages: string[];
  open: boolean;
  steps: Step[];
  files: string[];
  filesNotListed: number;
  usage: Usage | null;
  plan: PlanEntry[];
}

export function emptyModel(): RunModel {
  return {
    runId: null,
    parentRunId: null,
    continuedBy: null,
    branch: null,
    project: null,
    provider: null,
    state: null,
    executionState: null,
    stopReason: null,
    failureKind: null,
    recoveryKind: null,
    runnerOffline: false,
    historyLost: false,
    startedAt: null,
    endedAt: null,
    lastSeq: 0,
    messages: [],
    open: false,
    steps: [],
    files: [],
    filesNotListed: 0,
    usage: null,
    plan: [],
  };
}

// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

/** `text` with every terminal and bidi control made visible (`ESC` → `\x1b`); newlines and tabs stay. */
export function visibleControls(text: string): string {
  return text.replace(CONTROL, (c) => {
    const code = c.charCodeAt(0);
    return code <= 0xff ? `\\x${code.toString(16).padStart(2, "0")}` : `\\u${code.toString(16).padStart(4, "0")}`;
  });
}

/** A changed file's path as shown: relative paths as they are; anything absolute as OUTSIDE_PROJECT. */
export function shownPath(path: string): string {
  if (/^(?:[/\\~]|[A-Za-z]:)/.test(path) || path.split(/[/\\]/).includes("..")) return OUTSIDE_PROJECT;
  return visibleControls(path);
}

const STEP_STATUS: Record<string, StepStatus> = {
  pending: "pending",
  in_progress: "running",
  completed: "done",
  failed: "failed",
};

type Json = Record<string, unknown>;
const str = (v: unknown): string | null => (typeof v === "string" ? v : null);
const num = (v: unknown): number | null => (typeof v === "number" && Number.isFinite(v) ? v : null);

function closeParagraph(m: RunModel): void {
  m.open = false;
}

function upsertStep(m: RunModel, id: string, patch: Partial<Step>): void {
  const existing = m.steps.find((s) => s.id === id);
  if (existing) {
    Object.assign(existing, patch);
    return;
  }
  m.steps.push({ id, title: patch.title ?? id, kind: patch.kind ?? "other", status: patch.status ?? "pending" });
  if (m.steps.length > MAX_STEPS) m.steps.splice(0, m.steps.length - MAX_STEPS);
}

/** Folds one run event (protocol RunEvent) into the model. Unknown kinds are ignored. */
export function applyEvent(m: RunModel, e: Json): void {
  const seq = num(e.seq);
  if (seq !== null) {
    if (seq <= m.lastSeq) return;
    m.lastSeq = seq;
  }
  const at = Date.parse(str(e.at) ?? "");
  if (seq === 1 && Number.isFinite(at)) m.startedAt = at;
  switch (e.kind) {
    case "agent_message": {
      const text = visibleControls(str(e.text) ?? "");
      if (m.open && m.messages.length > 0) {
        const joined = m.messages[m.messages.length - 1] + text;
        m.messages[m.messages.length - 1] =
          joined.length > MAX_MESSAGE_CHARS ? joined.slice(-MAX_MESSAGE_CHARS) : joined;
      } else {
        m.messages.push(text.slice(-MAX_MESSAGE_CHARS));
        if (m.messages.length > MAX_MESSAGE_BLOCKS) m.messages.splice(0, m.messages.length - MAX_MESSAGE_BLOCKS);
      }
      m.open = true;
      return;
    }
    case "tool_activity": {
      closeParagraph(m);
      upsertStep(m, visibleControls(str(e.tool_call_id) ?? ""), {
        title: visibleControls(str(e.title) ?? ""),
        kind: str(e.tool_kind) ?? "other",
        status: STEP_STATUS[str(e.status) ?? ""] ?? "pending",
      });
      return;
    }
    case "permission_request": {
      closeParagraph(m);
      upsertStep(m, visibleControls(str(e.tool_call_id) ?? ""), {
        title: visibleControls(str(e.title) ?? ""),
        status: "waiting",
      });
      return;
    }
    case "file_change": {
      const path = shownPath(str(e.path) ?? "");
      if (m.files.includes(path)) return;
      if (m.files.length >= MAX_FILES) m.filesNotListed++;
      else m.files.push(path);
      return;
    }
    case "usage":
      m.usage = {
        usedTokens: num(e.used_tokens),
        contextSize: num(e.context_size),
        costAmount: num(e.cost_amount),
        costCurrency: str(e.cost_currency),
      };
      return;
    case "plan":
      m.plan = (Array.isArray(e.entries) ? (e.entries as Json[]) : []).map((p) => ({
        content: visibleControls(str(p.content) ?? ""),
        status: str(p.status) ?? "pending",
      }));
      return;
    case "terminal":
      closeParagraph(m);
      if (Number.isFinite(at)) m.endedAt = at;
      return;
    default:
      return;
  }
}

/** Folds one observe_coding_agent result (its structuredContent) into the model. */
export function applyObservation(m: RunModel, o: Json, now: number): void {
  const runId = str(o.run_id);
  if (runId !== null) m.runId = runId;
  const state = str(o.state);
  if (state !== null) m.state = state as RunState;
  m.executionState = str(o.execution_state) ?? m.executionState;
  m.stopReason = str(o.stop_reason);
  m.failureKind = str(o.failure_kind);
  m.recoveryKind = str(o.recovery_kind) ?? m.recoveryKind;
  m.runnerOffline = o.runner_offline === true;
  m.parentRunId = runIdOf(o.parent_run_id) ?? m.parentRunId;
  m.continuedBy = runIdOf(o.continued_by) ?? m.continuedBy;
  const ws = o.workspace as Json | undefined;
  if (typeof ws === "object" && ws !== null && typeof ws.branch === "string") m.branch = visibleControls(ws.branch);
  if (o.history_lost === true) m.historyLost = true;
  for (const e of Array.isArray(o.events) ? (o.events as Json[]) : []) applyEvent(m, e);
  // The run's latest usage as the Server keeps it: shown even when its usage events are gone (history lost).
  if (typeof o.usage === "object" && o.usage !== null) applyEvent(m, { ...(o.usage as Json), kind: "usage" });
  if (m.startedAt === null) m.startedAt = now;
  if (isTerminal(m) && m.endedAt === null) m.endedAt = now;
}

/** A run id from a result, or null (anything else is not drawn). */
function runIdOf(v: unknown): string | null {
  return typeof v === "string" && /^[A-Za-z0-9_-]{1,128}$/.test(v) ? v : null;
}

/**
 * A get_coding_agent_changes result (its structuredContent) as the view shows it: paths as changed files are
 * (shownPath), the diff's controls made visible and cut at MAX_DIFF_CHARS. The diff is project content for the
 * run's owner: it is only ever drawn as text.
 */
export function changesOf(sc: Json): ChangesModel {
  const files = Array.isArray(sc.files) ? (sc.files as Json[]) : [];
  const diff = str(sc.diff) ?? "";
  return {
    recorded: sc.recorded === true,
    branch: visibleControls(str(sc.branch) ?? ""),
    files: files.slice(0, MAX_CHANGE_FILES).map((f) => ({
      path: shownPath(str(f.path) ?? ""),
      oldPath: str(f.old_path) === null ? null : shownPath(str(f.old_path) ?? ""),
      status: visibleControls(str(f.status) ?? ""),
      insertions: num(f.insertions) ?? 0,
      deletions: num(f.deletions) ?? 0,
      binary: f.binary === true,
    })),
    filesNotListed: sc.files_truncated === true || files.length > MAX_CHANGE_FILES,
    diff: visibleControls(diff.slice(0, MAX_DIFF_CHARS)),
    diffCut: typeof sc.next_cursor === "string" || sc.diff_truncated === true || diff.length > MAX_DIFF_CHARS,
  };
}

export function isTerminal(m: RunModel): boolean {
  return m.state !== null && TERMINAL_STATES.has(m.state);
}

/** "4.2s", "3m 07s", "1h 02m" — the CLI's duration format. */
export function formatDuration(ms: number): string {
  if (ms < 60_000) return `${(Math.max(0, ms) / 1000).toFixed(1)}s`;
  const total = Math.round(ms / 1000);
  const h = Math.floor(total / 3600);
  const min = Math.floor((total % 3600) / 60);
  const s = total % 60;
  return h > 0 ? `${h}h ${String(min).padStart(2, "0")}m` : `${min}m ${String(s).padStart(2, "0")}s`;
}

/** The state as a person reads it; `lost` is neither success nor failure. */
export const STATE_LABEL: Record<RunState, string> = {
  starting: "Starting",
  running: "Running",
  waiting_permission: "Waiting for permission",
  completed: "Completed",
  failed: "Failed",
  cancelled: "Cancelled",
  lost: "Unknown whether it ran",
};

/** What to do next after a terminal state (the CLI's advice, without its commands). */
export function adviceFor(m: RunModel): string | null {
  switch (m.state) {
    case "failed":
      if (m.executionState === "not_started")
        return m.recoveryKind === "retry_same"
          ? "Nothing ran. Retrying with the same idempotency key is safe once the cause is fixed."
          : "Nothing ran. Fix the cause and start a new run.";
      return "The agent ran and the turn failed. Review the project's working tree before starting another run.";
    case "cancelled":
      return m.executionState === "not_started"
        ? null
        : "The agent stopped. Changes it already made stay in the project's working tree.";
    case "lost":
      return "The outcome cannot be proved: the prompt may have run. Inspect the project (git status, git diff) before deciding; do not simply start it again.";
    default:
      return null;
  }
}
