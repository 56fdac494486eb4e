/**
 * What the operator console shows, as data: the view shapes its page and snapshot stream carry, the
 * query-string filters that choose the runs (parsed here, a bad value named with what is allowed), and the
 * masking of absolute paths in labels an agent or Runner wrote. The reader that fills them from shared state is
 * snapshot.ts.
 */
import { type ChangedFile, RUN_STATES, type RunUsage } from "@webcodex/protocol";
import type { CostTotal } from "../state/record.js";

export const CONSOLE_FILTER_MAX_CHARS = 128;

export const PATH_MASK = "‹path›";

/**
 * Masks absolute paths (POSIX `/x`, home `~/x`, Windows `C:\x`, UNC `\\x`) in a label an agent or Runner wrote.
 * A path relative to the project (what file_change events carry) is kept.
 */
export function maskPaths(text: string): string {
  return text.replace(/(^|[\s"'`(=:[{,])(?:~?\/|[A-Za-z]:[\\/]|\\\\)[^\s"'`)\]},]*/g, `$1${PATH_MASK}`);
}

export interface ConsoleFilters {
  state: string | null;
  project: string | null;
  principal: string | null;
  run: string | null;
}

export type FilterResult = { ok: true; filters: ConsoleFilters } | { ok: false; error: string };

const FILTER_VALUE = /^[\x21-\x7e]+$/;

/** Query parameters → filters; a bad value is named with what is allowed. */
export function parseFilters(params: URLSearchParams): FilterResult {
  const out: ConsoleFilters = { state: null, project: null, principal: null, run: null };
  for (const key of ["state", "project", "principal", "run"] as const) {
    const v = params.get(key);
    if (v === null || v === "") continue;
    if (v.length > CONSOLE_FILTER_MAX_CHARS || !FILTER_VALUE.test(v)) {
      return {
        ok: false,
        error: `${key}: must be 1-${CONSOLE_FILTER_MAX_CHARS} printable ASCII characters without spaces`,
      };
    }
    if (key === "state" && v !== "active" && !(RUN_STATES as readonly string[]).includes(v)) {
      return { ok: false, error: `state: must be "active" or one of ${RUN_STATES.join(", ")}` };
    }
    out[key] = v;
  }
  return { ok: true, filters: out };
}

export interface RunnerView {
  runner_id: string;
  online: boolean;
  /** When it came online, or went offline; null: never seen by this state DB. */
  since: string | null;
  protocol_version: number | null;
  /** The Runner's software version (its hello); null when it did not say. */
  runner_version: string | null;
  projects: { project_id: string; allow_patch: boolean }[];
  providers: { provider_id: string; name: string }[];
  runs_in_use: number;
  max_concurrent_runs: number | null;
  agents_share_runner_user: boolean | null;
  last_refusal: { at: string; event: string; count: number } | null;
}

export interface RunView {
  run_id: string;
  principal_id: string;
  project_id: string;
  provider_id: string;
  runner_id: string;
  state: string;
  execution_state: string;
  stop_reason: string | null;
  failure_kind: string | null;
  recovery_kind: string;
  admission: string;
  created_at: string;
  updated_at: string;
  /** The run's latest reported usage (numbers and a currency code), or null. */
  usage: RunUsage | null;
}

export interface EventView {
  seq: number;
  at: string;
  kind: string;
  /** A one-line, path-masked description; agent text is reduced to its length. */
  summary: string;
}

/** How the selected run ended (or stands), as `observe` tells its caller. */
export interface RunOutcomeView {
  state: string;
  execution_state: string;
  stop_reason: string | null;
  failure_kind: string | null;
  recovery_kind: string;
  /** The Runner's fixed terminal text, paths masked; null before it ended. */
  message: string | null;
}

/**
 * The selected worktree run's change as the console shows it (design §16): where it is and which files it
 * touched, with counts. Never the diff: that is project content for the run's owner (get_coding_agent_changes,
 * the run view).
 */
export interface RunChangesView {
  branch: string;
  base_commit: string;
  head_commit: string | null;
  /** The Runner recorded the change (the run ended); before that only the branch and base are known. */
  recorded: boolean;
  files: Pick<ChangedFile, "path" | "old_path" | "status" | "insertions" | "deletions" | "binary">[];
  /** More files changed than `files` lists (the Runner's bound or CONSOLE_CHANGED_FILES_MAX). */
  files_truncated: boolean;
  /** Why the files are not listed (the Runner offline, or not answering in time); null when they are. */
  unavailable: string | null;
}

export interface RunEventsView {
  run_id: string;
  /** The run this one continues, and the run that continued it (design §17). */
  parent_run_id: string | null;
  continued_by: string | null;
  /** A worktree run's change (files only); null for a run in the project's tree, or one this Server holds nothing of. */
  changes: RunChangesView | null;
  /** This instance holds the run's event mirror. */
  held: boolean;
  /**
   * Earlier events of the run are gone for good, as `observe` says `history_lost`: its Runner restarted (its
   * ring is in memory) or no longer keeps them (a bounded ring, a pruned run), so this Server cannot fetch them.
   */
  history_lost: boolean;
  /** The run's state and outcome from the state DB; null when no such run is recorded. */
  outcome: RunOutcomeView | null;
  events: EventView[];
}

export interface ConsoleSnapshot {
  runners: RunnerView[];
  runs: RunView[];
  /** Reported cost per principal, UTC day and currency (from the kept run records). */
  costs: CostTotal[];
  filters: ConsoleFilters;
  /** The selected run's newest events held by this instance's mirror, and its outcome; null: no run selected. */
  run_events: RunEventsView | null;
  refusals: { at: string; source: string; who: string; what: string; outcome: string }[];
  /** Webhook subscriptions (never a secret or a URL's path) and dead letters (ids, state, counts; never a body). */
  webhooks: {
    subscriptions: {
      subscription_id: string;
      principal_id: string;
      /** The receiver's host (a URL's path and query may carry a token; they are not shown). */
      host: string;
      event_types: string[];
      status: string;
      consecutive_failures: number;
      pending: number;
      delivered: number;
      dead: number;
    }[];
    dead_letters: {
      event_id: string;
      subscription_id: string;
      event_type: string;
      /** The run (or task) the event is about. */
      run_id: string;
      /** The state (or outcome) the event's body names, if any. */
      state: string | null;
      attempts: number;
      last_status: number | null;
      last_error: string | null;
      created_at: string;
    }[];
  };
  audit: {
    mcp: { at: string; principal_id: string; tool: string; run_id: string | null; outcome: string; ms: number }[];
    link: { at: string; runner_id: string; event: string; count: number; remote: string | null }[];
    oauth: {
      at: string;
      event: string;
      client_id: string | null;
      principal_id: string | null;
      grant_id: string | null;
      detail: string | null;
    }[];
  };
  oauth: {
    clients: {
      client_id: string;
      kind: string;
      client_name: string | null;
      coding_agent_run: boolean;
      operator_read: boolean;
      created_at: string;
      revoked_at: string | null;
    }[];
    grants: {
      grant_id: string;
      client_id: string;
      principal_id: string;
      scopes: string[];
      projects: string[];
      created_at: string;
      revoked_at: string | null;
      revoked_reason: string | null;
    }[];
  };
}
