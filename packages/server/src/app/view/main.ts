/**
 * The run view's page script (design §15): an MCP App that follows one run through its host.
 *
 * The host hands the view the tool's input (project, provider) and result (run id, observation token);
 * the view then calls `observe_coding_agent` through the host bridge (`app.callServerTool`) in long polls
 * from that token until the run is terminal, and `cancel_coding_agent` after the person confirms. A terminal
 * run of a `worktree` project (observe names its branch) gets one `get_coding_agent_changes` page, asked as the
 * caller: its files and diff, drawn as text. It holds
 * no credentials and loads nothing: every call goes through the host, which authenticates it as its own.
 * Every string from the run is drawn with `textContent` (model.ts makes controls visible first).
 */
import { App, applyDocumentTheme, type McpUiHostContext } from "@modelcontextprotocol/ext-apps/app-with-deps";
import {
  adviceFor,
  applyObservation,
  CHANGES_PAGE_BYTES,
  type ChangesModel,
  changesOf,
  emptyModel,
  formatDuration,
  isTerminal,
  type RunModel,
  STATE_LABEL,
  TERMINAL_STATES,
  visibleControls,
} from "./model.js";

/** Long-poll wait of each observe call (the Server's maximum is 30 s; hosts may time out longer calls). */
const OBSERVE_WAIT_SECS = 20;
/** Pause before retrying an observe call that failed. */
const RETRY_DELAY_MS = 2_000;
/** How often the elapsed time is redrawn while the run is live. */
const ELAPSED_TICK_MS = 1_000;

/** Times the view asks for a run's change while the Runner has not recorded it yet (one RETRY_DELAY_MS apart). */
const MAX_CHANGES_TRIES = 10;

const OBSERVE_TOOL = "observe_coding_agent";
const CANCEL_TOOL = "cancel_coding_agent";
const CHANGES_TOOL = "get_coding_agent_changes";
/** The `_meta` key under which a task-backed start (MCP Tasks) names its run (server mcp/run-tasks.ts). */
const RUN_META = "dev.webcodex/run";

type Json = Record<string, unknown>;

const model: RunModel = emptyModel();
let token: string | null = null;
let following = false;
let cancelPending = false;
let problem: string | null = null;
/** The recorded change of a worktree run once it ended (design §16), and the run it was asked for. */
let changes: ChangesModel | null = null;
let changesFor: string | null = null;
let changesProblem: string | null = null;

function byId<T extends HTMLElement>(id: string): T {
  const el = document.getElementById(id);
  if (!el) throw new Error(`run view: #${id} missing`);
  return el as T;
}

function item(tag: string, text: string, className?: string): HTMLElement {
  const el = document.createElement(tag);
  el.textContent = text;
  if (className) el.className = className;
  return el;
}

function formatCount(n: number): string {
  return n.toLocaleString("en-US");
}

function drawElapsed(): void {
  const start = model.startedAt;
  byId("elapsed").textContent = start === null ? "" : formatDuration((model.endedAt ?? Date.now()) - start);
}

function draw(): void {
  byId("run-id").textContent = model.runId ?? "—";
  byId("project").textContent = model.project ?? "—";
  byId("provider").textContent = model.provider ?? "—";
  const state = byId("state");
  state.textContent = model.state === null ? "Waiting for the run" : STATE_LABEL[model.state];
  state.dataset.state = model.state ?? "";
  drawElapsed();
  byId("offline").hidden = !model.runnerOffline || isTerminal(model);
  byId("history-lost").hidden = !model.historyLost;

  const messages = byId("messages");
  messages.replaceChildren(...model.messages.map((m) => item("p", m, "message")));
  byId("messages-empty").hidden = model.messages.length > 0;

  const steps = byId("steps");
  steps.replaceChildren(
    ...model.steps.map((s) => {
      const li = item("li", "", "step");
      li.dataset.status = s.status;
      li.dataset.id = s.id;
      li.append(item("span", s.status, "status"), item("span", s.title || s.id, "title"));
      return li;
    }),
  );
  byId("steps-empty").hidden = model.steps.length > 0;

  const plan = byId("plan");
  plan.replaceChildren(
    ...model.plan.map((p) => {
      const li = item("li", p.content);
      li.dataset.status = p.status;
      return li;
    }),
  );
  byId("plan-section").hidden = model.plan.length === 0;

  const files = byId("files");
  files.replaceChildren(...model.files.map((f) => item("li", f)));
  if (model.filesNotListed > 0) files.append(item("li", `and ${model.filesNotListed} more`, "more"));
  byId("files-empty").hidden = model.files.length > 0;

  byId("parent-row").hidden = model.parentRunId === null;
  byId("parent-run").textContent = model.parentRunId ?? "";
  byId("child-row").hidden = model.continuedBy === null;
  byId("child-run").textContent = model.continuedBy ?? "";
  drawChanges();

  const u = model.usage;
  const usage: string[] = [];
  if (u?.usedTokens != null)
    usage.push(
      u.contextSize != null
        ? `${formatCount(u.usedTokens)} of ${formatCount(u.contextSize)} tokens`
        : `${formatCount(u.usedTokens)} tokens`,
    );
  if (u?.costAmount != null) usage.push(`${u.costAmount} ${visibleControls(u.costCurrency ?? "")}`.trim());
  byId("usage").textContent = usage.length > 0 ? usage.join(" · ") : "—";

  const final = byId("final");
  final.hidden = !isTerminal(model);
  if (isTerminal(model) && model.state !== null) {
    final.dataset.state = model.state;
    byId("final-state").textContent = STATE_LABEL[model.state];
    const facts: string[] = [];
    if (model.stopReason) facts.push(`stop reason ${model.stopReason}`);
    if (model.failureKind) facts.push(model.failureKind);
    if (model.recoveryKind) facts.push(`recovery ${model.recoveryKind}`);
    byId("final-facts").textContent = facts.join(" · ");
    byId("final-advice").textContent = adviceFor(model) ?? "";
  }

  const live = model.runId !== null && !isTerminal(model);
  byId("cancel").hidden = !live || cancelPending;
  byId("cancel-button").toggleAttribute("disabled", !live || cancelPending);
  if (!live) byId("confirm").hidden = true;
  const err = byId("problem");
  err.hidden = problem === null;
  err.textContent = problem ?? "";
}

/** One diff line, classed by its first character (added, removed, hunk header); drawn as text. */
function diffLine(line: string): HTMLElement {
  const cls = line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : line.startsWith("@@") ? "hunk" : "";
  return item("span", `${line}\n`, cls || undefined);
}

function drawChanges(): void {
  const section = byId("change-section");
  section.hidden = model.branch === null || !isTerminal(model);
  if (section.hidden) return;
  const note = byId("change-note");
  const list = byId("change-files");
  const diff = byId("diff");
  const cut = byId("diff-cut");
  if (changes === null || !changes.recorded) {
    note.textContent = changesProblem ?? `Reading the change on branch ${model.branch}…`;
    list.replaceChildren();
    diff.hidden = true;
    cut.hidden = true;
    return;
  }
  note.textContent =
    changes.files.length === 0 ? `No change on branch ${changes.branch}.` : `On branch ${changes.branch}:`;
  list.replaceChildren(
    ...changes.files.map((f) => {
      const li = item("li", "");
      li.dataset.status = f.status;
      const name = f.oldPath !== null ? `${f.oldPath} → ${f.path}` : f.path;
      li.append(
        item("span", f.status, "status"),
        item("span", ` ${name}`, "path"),
        item("span", f.binary ? "binary" : `+${f.insertions} −${f.deletions}`, "counts"),
      );
      return li;
    }),
  );
  if (changes.filesNotListed) list.append(item("li", "and more files, not listed", "more"));
  diff.hidden = changes.diff === "";
  diff.replaceChildren(...changes.diff.split("\n").map(diffLine));
  cut.hidden = !changes.diffCut;
  cut.textContent = changes.diffCut ? `The diff goes on: webcodex changes ${model.runId} --patch shows all of it.` : "";
}

/** Once a worktree run ended: its recorded change, asked as the caller (the tool's ownership rule applies). */
async function loadChanges(app: App): Promise<void> {
  const runId = model.runId;
  if (runId === null || model.branch === null || !isTerminal(model) || changesFor === runId) return;
  changesFor = runId;
  changes = null;
  changesProblem = null;
  for (let tries = 0; tries < MAX_CHANGES_TRIES && model.runId === runId; tries++) {
    let result: Json;
    try {
      result = (await app.callServerTool({
        name: CHANGES_TOOL,
        arguments: { run_id: runId, max_bytes: CHANGES_PAGE_BYTES },
      })) as Json;
    } catch (err) {
      changesProblem = `Could not read the change through the host: ${visibleControls(String((err as Error)?.message ?? err))}`;
      draw();
      await sleep(RETRY_DELAY_MS);
      continue;
    }
    if (model.runId !== runId) return;
    if (result.isError === true) {
      changesProblem = errorOf(result).message;
      draw();
      return;
    }
    const sc = result.structuredContent as Json | undefined;
    if (sc && sc.recorded === true) {
      changes = changesOf(sc);
      changesProblem = null;
      draw();
      return;
    }
    await sleep(RETRY_DELAY_MS);
  }
  if (model.runId === runId && changes === null) {
    changesProblem = "The change is not recorded yet; open the run again later to see it.";
    draw();
  }
}

/** The `{error:{message}}` text of a tool error result, as plain text. */
function errorOf(result: Json): { code: string | null; message: string } {
  const content = Array.isArray(result.content) ? (result.content as Json[]) : [];
  const text = content.map((c) => (typeof c.text === "string" ? c.text : "")).join("");
  try {
    const parsed = JSON.parse(text) as { error?: { code?: unknown; message?: unknown } };
    if (typeof parsed.error?.message === "string")
      return {
        code: typeof parsed.error.code === "string" ? parsed.error.code : null,
        message: visibleControls(parsed.error.message),
      };
  } catch {
    // not the Server's error envelope
  }
  return { code: null, message: visibleControls(text || "The tool call failed.") };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function follow(app: App): Promise<void> {
  if (following) return;
  following = true;
  try {
    while (model.runId !== null && !isTerminal(model)) {
      const args: Json = { run_id: model.runId, wait_secs: OBSERVE_WAIT_SECS };
      if (token !== null) args.after_observation_token = token;
      let result: Json;
      try {
        result = (await app.callServerTool({ name: OBSERVE_TOOL, arguments: args })) as Json;
      } catch (err) {
        problem = `Could not reach the run through the host: ${visibleControls(String((err as Error)?.message ?? err))}`;
        draw();
        await sleep(RETRY_DELAY_MS);
        continue;
      }
      if (result.isError === true) {
        const e = errorOf(result);
        if (e.code === "invalid_observation_token") {
          token = null; // start again from a bounded baseline; the model ignores events it already has
          continue;
        }
        problem = e.message;
        draw();
        await sleep(RETRY_DELAY_MS);
        continue;
      }
      const observed = result.structuredContent as Json | undefined;
      if (!observed) {
        problem = "The host returned an observation without structured content.";
        draw();
        await sleep(RETRY_DELAY_MS);
        continue;
      }
      problem = null;
      if (typeof observed.observation_token === "string") token = observed.observation_token;
      applyObservation(model, observed, Date.now());
      draw();
    }
  } finally {
    following = false;
  }
  void loadChanges(app);
}

/** The run a tool result names: a start or observe result, or a task-backed start (`_meta`). */
function runOf(result: Json): Json | null {
  const sc = result.structuredContent as Json | undefined;
  if (sc && typeof sc.run_id === "string") return sc;
  const meta = result._meta as Json | undefined;
  const fromTask = meta?.[RUN_META] as Json | undefined;
  return fromTask && typeof fromTask.run_id === "string" ? fromTask : null;
}

function onToolResult(app: App, result: Json): void {
  if (result.isError === true) {
    problem = errorOf(result).message;
    draw();
    return;
  }
  const run = runOf(result);
  if (run === null) return;
  if (run.run_id !== model.runId) {
    Object.assign(model, emptyModel(), { project: model.project, provider: model.provider });
    changes = null;
    changesFor = null;
    changesProblem = null;
  }
  model.runId = run.run_id as string;
  // A start result's token observes from the run's beginning. An observe result's events begin wherever its
  // caller's cursor was, and a replayed start may be long over: both follow from a bounded baseline instead.
  // The state comes from the first observation either way.
  const fromStart = !Array.isArray(run.events) && typeof run.state === "string" && !TERMINAL_STATES.has(run.state);
  token = fromStart && typeof run.observation_token === "string" ? run.observation_token : null;
  draw();
  void follow(app);
}

async function cancelRun(app: App): Promise<void> {
  if (model.runId === null) return;
  cancelPending = true;
  byId("confirm").hidden = true;
  draw();
  try {
    const result = (await app.callServerTool({ name: CANCEL_TOOL, arguments: { run_id: model.runId } })) as Json;
    if (result.isError === true) {
      problem = errorOf(result).message;
      cancelPending = false;
    } else {
      problem = null;
      byId("cancel-note").hidden = false;
    }
  } catch (err) {
    problem = `Could not cancel through the host: ${visibleControls(String((err as Error)?.message ?? err))}`;
    cancelPending = false;
  }
  draw();
}

function applyHostContext(ctx: McpUiHostContext | undefined): void {
  if (ctx?.theme) applyDocumentTheme(ctx.theme);
}

async function main(): Promise<void> {
  const app = new App({ name: "webcodex-run-view", version: "0.1.0" }, {}, { autoResize: true });
  app.ontoolinput = ({ arguments: args }) => {
    if (typeof args?.project_id === "string") model.project = visibleControls(args.project_id);
    if (typeof args?.provider_id === "string") model.provider = visibleControls(args.provider_id);
    if (typeof args?.run_id === "string" && model.runId === null) model.runId = args.run_id;
    draw();
  };
  app.ontoolresult = (result) => onToolResult(app, result as Json);
  app.onhostcontextchanged = (ctx) => applyHostContext(ctx);
  app.onteardown = () => {
    model.runId = null; // ends the follow loop after its current call
    return {};
  };

  byId("cancel-button").addEventListener("click", () => {
    byId("confirm").hidden = false;
    byId("confirm-yes").focus();
  });
  byId("confirm-no").addEventListener("click", () => {
    byId("confirm").hidden = true;
  });
  byId("confirm-yes").addEventListener("click", () => void cancelRun(app));
  setInterval(() => {
    if (!isTerminal(model)) drawElapsed();
  }, ELAPSED_TICK_MS);

  draw();
  await app.connect();
  applyHostContext(app.getHostContext());
}

void main().catch((err: unknown) => {
  problem = `The view could not connect to its host: ${visibleControls(String((err as Error)?.message ?? err))}`;
  draw();
});
