/**
 * What the operator console shows, read from shared state: the state DB (runner presence, admission records,
 * mcp_audit, runner_link_audit, the OAuth tables) and the run core's event mirrors. Nothing here comes from
 * one request's memory, so every instance sharing the database shows the same fleet.
 *
 * Every field is chosen, never copied wholesale: no prompt (admission records hold none; agent message and
 * reasoning text is reduced to its length), no token or key (the tables hold hashes; none is selected), no
 * env value, and any absolute path in a label an agent wrote (tool titles) or in a run's terminal `message`
 * (the Runner's fixed texts, which name at most an option id, a variable name or a stop reason) is masked by
 * `maskPaths` (views.ts, with the view shapes it fills). Every list is bounded by a named constant.
 *
 * The selected run also shows its chain (`run_continuations`) and, in a `worktree` project, its changed files
 * with counts, asked of its Runner — never the diff, which is project content for the run's owner (design §16).
 * Webhook subscriptions show the receiver's host only (a URL's path may carry a token), dead letters their ids,
 * the state their body names and their counts — never the body.
 */
import type { RunChanges, RunEvent } from "@webcodex/protocol";
import type { ServerConfig } from "../config.js";
import { type PresenceRow, presenceAt } from "../link/presence.js";
import { type OAuthStore, parseJsonList } from "../oauth/store.js";
import { continuationLinks } from "../runs/continuation.js";
import type { MirrorSet } from "../runs/mirror.js";
import { resumePoint } from "../runs/observe.js";
import { recordUsage } from "../runs/usage.js";
import type { RecordFilter } from "../state/record.js";
import type { StateStore } from "../state/store.js";
import { WebhookOutbox } from "../webhooks/outbox.js";
import { WebhookSubscriptions } from "../webhooks/subscriptions.js";
import {
  type ConsoleFilters,
  type ConsoleSnapshot,
  maskPaths,
  type RunChangesView,
  type RunnerView,
  type RunOutcomeView,
  type RunView,
} from "./views.js";

/** Runs one snapshot lists (newest first); the filters narrow which. */
export const CONSOLE_RUNS_PAGE = 50;
/** Rows of reported cost per principal and day (and currency) one snapshot lists, newest day first. */
export const CONSOLE_COST_ROWS = 60;
/** Newest events of the selected run a snapshot carries. */
export const CONSOLE_RUN_EVENTS_MAX = 200;
/** Longest a snapshot waits for one run's events from its Runner (through the instance holding its link). */
export const CONSOLE_EVENTS_FOLLOW_MS = 2_000;
/** Rows of each audit list (MCP calls, link events, OAuth events) and of recent refusals. */
export const CONSOLE_AUDIT_ROWS = 40;
/** OAuth clients and grants listed (newest first). */
export const CONSOLE_OAUTH_ROWS = 100;
/** Files of the selected run's recorded change a snapshot lists (paths, statuses, counts; never the diff). */
export const CONSOLE_CHANGED_FILES_MAX = 200;
/** Longest a snapshot waits for the Runner's answer about the selected run's change. */
export const CONSOLE_CHANGES_FOLLOW_MS = 2_000;
/** Recorded changes' file lists kept by a reader (a recorded change never changes), least recently read dropped. */
export const CONSOLE_CHANGES_CACHED = 64;
/** Webhook subscriptions and dead letters a snapshot lists (newest dead letters first). */
export const CONSOLE_WEBHOOK_ROWS = 50;
/**
 * The subscriptions' counts (pending, delivered, dead: counted over the outbox) are read again at most this often
 * by a reader, however many streams are open; the dead letters themselves are read at every snapshot.
 */
export const CONSOLE_WEBHOOK_COUNTS_MS = 5_000;
/** Longest filter value accepted (project ids, principal ids, run ids are shorter). */
function eventSummary(e: RunEvent): string {
  switch (e.kind) {
    case "agent_message":
    case "reasoning":
      return `${e.text.length} characters${e.truncated ? " (truncated)" : ""}`;
    case "plan":
      return `${e.entries.length} entries: ${e.entries.map((x) => x.status).join(", ")}`;
    case "tool_activity":
      return `${e.status} ${e.tool_kind}: ${maskPaths(e.title)}`;
    case "file_change":
      return maskPaths(e.path);
    case "terminal_activity":
      return `terminal ${maskPaths(e.terminal_id)}`;
    case "usage":
      return `tokens ${e.used_tokens ?? "?"} of ${e.context_size ?? "?"}`;
    case "permission_request":
      return `asks: ${maskPaths(e.title)}`;
    case "agent_state":
      return e.change === "mode" ? `mode ${maskPaths(e.mode_id ?? "")}` : e.change;
    case "terminal":
      return [e.state, e.stop_reason, e.failure_kind].filter((x) => x !== null).join(" ");
  }
}

/** What the console reads of a run's change: its files without the diff, or why not. */
export type ChangedFilesRead = (
  runId: string,
  timeoutMs: number,
) => Promise<{ ok: true; value: Omit<RunChanges, "diff"> } | { ok: false; error: { message: string } }>;

/** The host of a receiver's URL (or "-" when it does not parse). */
function hostOf(url: string): string {
  try {
    return new URL(url).host;
  } catch {
    return "-";
  }
}

/** The `state` (run) or `outcome` (task) an event body names, or null: nothing else of the body is shown. */
function bodyState(body: string): string | null {
  try {
    const data = (JSON.parse(body) as { data?: { state?: unknown; outcome?: unknown } }).data;
    const v = data?.state ?? data?.outcome;
    return typeof v === "string" && /^[a-z_]{1,32}$/.test(v) ? v : null;
  } catch {
    return null;
  }
}

export class ConsoleReader {
  readonly #state: StateStore;
  readonly #oauth: OAuthStore;
  readonly #config: ServerConfig;
  readonly #mirrors: MirrorSet | null;
  readonly #followEvents: ((runId: string, timeoutMs: number) => Promise<void>) | undefined;
  readonly #operatorClients: () => Promise<ReadonlySet<string>>;
  readonly #presence: () => Promise<PresenceRow[]>;
  readonly #changedFiles: ChangedFilesRead | undefined;
  readonly #webhookSubscriptions: WebhookSubscriptions;
  readonly #outbox: WebhookOutbox;
  /** Recorded changes' file lists by run id (most recently read last). */
  readonly #changesCache = new Map<string, RunChangesView>();
  #subscriptions: { at: number; rows: ConsoleSnapshot["webhooks"]["subscriptions"] } | null = null;

  constructor(deps: {
    state: StateStore;
    oauth: OAuthStore;
    config: ServerConfig;
    mirrors: MirrorSet | null;
    /** Brings the mirror of a run up to its Runner's ring, wherever it is linked (runs/runs.ts followEvents). */
    followEvents?: (runId: string, timeoutMs: number) => Promise<void>;
    presence: () => Promise<PresenceRow[]>;
    operatorClients: () => Promise<ReadonlySet<string>>;
    /** A run's changed files, without the diff, from its Runner (runs/runs.ts changedFilesForOperator). */
    changedFiles?: ChangedFilesRead;
  }) {
    this.#state = deps.state;
    this.#oauth = deps.oauth;
    this.#config = deps.config;
    this.#mirrors = deps.mirrors;
    this.#followEvents = deps.followEvents;
    this.#presence = deps.presence;
    this.#operatorClients = deps.operatorClients;
    this.#changedFiles = deps.changedFiles;
    this.#webhookSubscriptions = new WebhookSubscriptions(deps.state.engine);
    this.#outbox = new WebhookOutbox(deps.state.engine);
  }

  async snapshot(filters: ConsoleFilters): Promise<ConsoleSnapshot> {
    const presence = await this.#presence();
    return {
      runners: await this.#runners(presence),
      runs: await this.#runs(filters),
      costs: await this.#state.costTotals(CONSOLE_COST_ROWS),
      filters,
      run_events: filters.run === null ? null : await this.#events(filters.run),
      refusals: await this.#refusals(),
      webhooks: await this.#webhooksView(),
      audit: await this.#audit(),
      oauth: await this.#oauthView(),
    };
  }

  async #runners(presence: readonly PresenceRow[]): Promise<RunnerView[]> {
    const engine = this.#state.engine;
    const inUse = await this.#state.countInUseByRunner();
    const nowMs = Date.now();
    const refusalOf = (runnerId: string) =>
      engine.get<{ at: string; last_at: string | null; event: string; count: number }>(
        `SELECT at, last_at, event, count FROM runner_link_audit
         WHERE runner_id = ? AND event IN ('link_refused_in_use', 'closed_token_rotated') ORDER BY id DESC LIMIT 1`,
        [runnerId],
      );
    const rows = new Map(presence.map((r) => [r.runner_id, r]));
    const ids = [...new Set([...this.#config.runners.map((r) => r.id), ...rows.keys()])].sort();
    const views: RunnerView[] = [];
    for (const id of ids) {
      const p = rows.get(id);
      const refusal = await refusalOf(id);
      const now = p ? presenceAt(p, nowMs) : null;
      views.push({
        runner_id: id,
        online: now?.online ?? false,
        since: now?.since ?? null,
        protocol_version: p?.protocol_version ?? null,
        runner_version: p?.runner_version ?? null,
        projects: p ? (JSON.parse(p.projects) as RunnerView["projects"]) : [],
        providers: p ? (JSON.parse(p.providers) as RunnerView["providers"]) : [],
        runs_in_use: inUse.get(id) ?? 0,
        max_concurrent_runs: p?.max_concurrent_runs ?? null,
        agents_share_runner_user:
          p?.agents_share_runner_user === null || p === undefined ? null : p.agents_share_runner_user === 1,
        last_refusal: refusal
          ? { at: refusal.last_at ?? refusal.at, event: refusal.event, count: refusal.count }
          : null,
      });
    }
    return views;
  }

  async #runs(f: ConsoleFilters): Promise<RunView[]> {
    // parseFilters admits only "active" or a RunState as `state`.
    const filter: RecordFilter = {};
    if (f.state !== null) filter.state = f.state as RecordFilter["state"] & string;
    if (f.project !== null) filter.project_id = f.project;
    if (f.principal !== null) filter.principal_id = f.principal;
    return (await this.#state.listRecent(filter, CONSOLE_RUNS_PAGE)).map(
      ({ usage_used_tokens, usage_context_size, usage_cost_amount, usage_cost_currency, ...run }) => ({
        ...run,
        usage: recordUsage({ usage_used_tokens, usage_context_size, usage_cost_amount, usage_cost_currency }) ?? null,
      }),
    );
  }

  async #events(runId: string): Promise<ConsoleSnapshot["run_events"]> {
    await this.#followEvents?.(runId, CONSOLE_EVENTS_FOLLOW_MS);
    const rec = await this.#state.peek(runId);
    const outcome: RunOutcomeView | null = rec
      ? {
          state: rec.state,
          execution_state: rec.execution_state,
          stop_reason: rec.stop_reason,
          failure_kind: rec.failure_kind,
          recovery_kind: rec.recovery_kind,
          message: rec.message === null ? null : maskPaths(rec.message),
        }
      : null;
    const links = await continuationLinks(this.#state.engine, runId);
    const chain = { parent_run_id: links.parent_run_id ?? null, continued_by: links.continued_by ?? null };
    const mirror = this.#mirrors?.get(runId);
    if (!mirror)
      return { run_id: runId, ...chain, changes: null, held: false, history_lost: false, outcome, events: [] };
    const all = mirror.eventsAfter(0);
    const workspace = mirror.summary?.workspace;
    return {
      run_id: runId,
      ...chain,
      changes: workspace ? await this.#changes(runId, workspace) : null,
      held: true,
      history_lost: resumePoint(mirror, null, mirror.instance ?? "").historyLost,
      outcome,
      events: all
        .slice(-CONSOLE_RUN_EVENTS_MAX)
        .map((e) => ({ seq: e.seq, at: e.at, kind: e.kind, summary: eventSummary(e) })),
    };
  }

  /**
   * A worktree run's change: before it is recorded, the branch and base from the Runner's summary; once
   * recorded, its files asked of the Runner once (then kept: a recorded change never changes) with a short wait.
   */
  async #changes(
    runId: string,
    ws: { branch: string; base_commit: string; head_commit?: string | undefined },
  ): Promise<RunChangesView> {
    const base: RunChangesView = {
      branch: ws.branch,
      base_commit: ws.base_commit,
      head_commit: ws.head_commit ?? null,
      recorded: false,
      files: [],
      files_truncated: false,
      unavailable: null,
    };
    if (ws.head_commit === undefined) return base;
    const cached = this.#changesCache.get(runId);
    if (cached) {
      this.#changesCache.delete(runId);
      this.#changesCache.set(runId, cached);
      return cached;
    }
    if (!this.#changedFiles) return { ...base, unavailable: "this Server cannot ask Runners for changes" };
    const res = await this.#changedFiles(runId, CONSOLE_CHANGES_FOLLOW_MS);
    if (!res.ok) return { ...base, unavailable: maskPaths(res.error.message) };
    if (!res.value.recorded) return base;
    const view: RunChangesView = {
      ...base,
      head_commit: res.value.head_commit ?? base.head_commit,
      recorded: true,
      files: res.value.files.slice(0, CONSOLE_CHANGED_FILES_MAX).map((f) => ({
        path: maskPaths(f.path),
        ...(f.old_path !== undefined ? { old_path: maskPaths(f.old_path) } : {}),
        status: f.status,
        insertions: f.insertions,
        deletions: f.deletions,
        binary: f.binary,
      })),
      files_truncated: res.value.files_truncated || res.value.files.length > CONSOLE_CHANGED_FILES_MAX,
    };
    if (this.#changesCache.size >= CONSOLE_CHANGES_CACHED) {
      const oldest = this.#changesCache.keys().next().value;
      if (oldest !== undefined) this.#changesCache.delete(oldest);
    }
    this.#changesCache.set(runId, view);
    return view;
  }

  async #webhooksView(): Promise<ConsoleSnapshot["webhooks"]> {
    const now = Date.now();
    if (this.#subscriptions === null || now - this.#subscriptions.at >= CONSOLE_WEBHOOK_COUNTS_MS) {
      this.#subscriptions = { at: now, rows: await this.#subscriptionRows() };
    }
    const dead_letters = (await this.#outbox.events({ status: "dead" }, CONSOLE_WEBHOOK_ROWS)).map((d) => ({
      event_id: d.event_id,
      subscription_id: d.subscription_id,
      event_type: d.event_type,
      run_id: d.run_id,
      state: bodyState(d.body),
      attempts: d.attempts,
      last_status: d.last_status,
      last_error: d.last_error === null ? null : maskPaths(d.last_error),
      created_at: new Date(d.created_ms).toISOString(),
    }));
    return { subscriptions: this.#subscriptions.rows, dead_letters };
  }

  async #subscriptionRows(): Promise<ConsoleSnapshot["webhooks"]["subscriptions"]> {
    return (await this.#webhookSubscriptions.list()).slice(-CONSOLE_WEBHOOK_ROWS).map((s) => ({
      subscription_id: s.subscription_id,
      principal_id: s.principal_id,
      host: hostOf(s.url),
      event_types: s.event_types,
      status: s.status,
      consecutive_failures: s.consecutive_failures,
      pending: s.pending,
      delivered: s.delivered,
      dead: s.dead,
    }));
  }

  async #refusals(): Promise<ConsoleSnapshot["refusals"]> {
    const engine = this.#state.engine;
    const n = CONSOLE_AUDIT_ROWS;
    const mcp = (
      await engine.all<{ at: string; principal_id: string; tool: string; outcome: string }>(
        "SELECT at, principal_id, tool, outcome FROM mcp_audit WHERE outcome != 'ok' ORDER BY id DESC LIMIT ?",
        [n],
      )
    ).map((r) => ({ at: r.at, source: "mcp", who: r.principal_id, what: r.tool, outcome: r.outcome }));
    const link = (
      await engine.all<{ at: string; last_at: string | null; runner_id: string; event: string; count: number }>(
        `SELECT at, last_at, runner_id, event, count FROM runner_link_audit
         WHERE event IN ('link_refused_in_use', 'closed_token_rotated') ORDER BY id DESC LIMIT ?`,
        [n],
      )
    ).map((r) => ({
      at: r.last_at ?? r.at,
      source: "runner link",
      who: r.runner_id,
      what: r.count > 1 ? `${r.count} hellos` : "hello",
      outcome: r.event,
    }));
    const oauth = (await this.#oauth.auditRowsOf(["consent_denied", "code_reused", "refresh_reused"], n)).map((r) => ({
      at: r.at,
      source: "oauth",
      who: r.principal_id ?? "-",
      what: r.client_id ?? "-",
      outcome: r.event,
    }));
    return [...mcp, ...link, ...oauth].sort((a, b) => (a.at < b.at ? 1 : a.at > b.at ? -1 : 0)).slice(0, n);
  }

  async #audit(): Promise<ConsoleSnapshot["audit"]> {
    const engine = this.#state.engine;
    const n = CONSOLE_AUDIT_ROWS;
    return {
      mcp: await engine.all<{
        at: string;
        principal_id: string;
        tool: string;
        run_id: string | null;
        outcome: string;
        ms: number;
      }>("SELECT at, principal_id, tool, run_id, outcome, duration_ms AS ms FROM mcp_audit ORDER BY id DESC LIMIT ?", [
        n,
      ]),
      link: await engine.all<{ at: string; runner_id: string; event: string; count: number; remote: string | null }>(
        "SELECT COALESCE(last_at, at) AS at, runner_id, event, count, remote FROM runner_link_audit ORDER BY id DESC LIMIT ?",
        [n],
      ),
      oauth: (await this.#oauth.auditRows(n)).reverse().map((r) => ({
        at: r.at,
        event: r.event,
        client_id: r.client_id,
        principal_id: r.principal_id,
        grant_id: r.grant_id,
        detail: r.detail,
      })),
    };
  }

  async #oauthView(): Promise<ConsoleSnapshot["oauth"]> {
    const operator = await this.#operatorClients();
    const clients = (await this.#oauth.clients())
      .reverse()
      .slice(0, CONSOLE_OAUTH_ROWS)
      .map((c) => ({
        client_id: c.client_id,
        kind: c.kind,
        client_name: c.client_name,
        coding_agent_run: c.allow_coding_agent_run === 1,
        operator_read: operator.has(c.client_id),
        created_at: c.created_at,
        revoked_at: c.revoked_at,
      }));
    const grants = (await this.#oauth.grants())
      .reverse()
      .slice(0, CONSOLE_OAUTH_ROWS)
      .map((g) => ({
        grant_id: g.grant_id,
        client_id: g.client_id,
        principal_id: g.principal_id,
        scopes: parseJsonList(g.scopes),
        projects: parseJsonList(g.projects),
        created_at: g.created_at,
        revoked_at: g.revoked_at,
        revoked_reason: g.revoked_reason,
      }));
    return { clients, grants };
  }
}
