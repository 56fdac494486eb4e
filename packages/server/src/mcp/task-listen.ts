/**
 * `subscriptions/listen` for task status (MCP 2026-07-28 with the Tasks
 * extension): the POST's answer is an SSE stream that carries
 * `notifications/subscriptions/acknowledged` (the task ids honored), then a
 * `notifications/tasks` with the full task — what `tasks/get` would answer
 * at that moment — for each honored task now and at every change of its
 * status or status message, each stamped with the subscription id (the
 * listen request's id) in `_meta`.
 *
 * Only the caller's own tasks are honored: an id that fails the task MAC or
 * names another principal's run is left out of the acknowledgement, as an
 * unknown one would be. Other filter fields (list-changed, resource
 * subscriptions) are never honored: this Server advertises none of them.
 *
 * Nothing is held between requests: each wait is the run's observe
 * long-poll (`RunsApi.observe` with an observation token), woken by the
 * run's event mirror on this Server, and each notification is built from the
 * durable run record. So any Server process can serve a listen; a change
 * applied by the instance holding the Runner's link wakes the observe here
 * through the database's notification (cluster/wake-ups.ts RUN_CHANGES_CHANNEL).
 *
 * Bounds: LISTEN_MAX_PER_PRINCIPAL open streams per principal on this
 * instance, each holding one slot of the principal's waiting-observe bound
 * (runs/observe-limits.ts) — both reserved before the first await and given
 * back on every path — LISTEN_MAX_TASK_IDS ids per stream (a non-canonical
 * spelling of a task id is refused, so none passes de-duplication), LISTEN_MAX_DURATION_MS per stream,
 * LISTEN_MAX_BUFFERED_BYTES unread by the client. The stream ends with the
 * empty `subscriptions/listen` result (a graceful close) when every honored
 * task is terminal, when the duration bound is reached, and when the Server
 * shuts down; a client that wants more listens again.
 */
import type { ServerResponse } from "node:http";
import { MAX_OBSERVE_WAIT_SECS } from "@webcodex/protocol";
import type { Logger } from "pino";
import type { Principal, RunsApi } from "../runs/api.js";
import type { ObserveLimits } from "../runs/observe-limits.js";
import type { Era } from "./era.js";
import {
  declaresTasks,
  isTerminalTaskStatus,
  nonCanonicalTaskId,
  type RunTasks,
  TASKS_EXTENSION,
} from "./run-tasks.js";

/** Open listen streams one principal may hold at once. */
export const LISTEN_MAX_PER_PRINCIPAL = 4;
/** Task ids one listen may ask for. */
export const LISTEN_MAX_TASK_IDS = 32;
/** A listen stream is ended (gracefully) after this long; the client listens again if it still cares. */
export const LISTEN_MAX_DURATION_MS = 15 * 60_000;
/** An SSE comment is written this often so idle proxies keep the stream open. */
export const LISTEN_KEEPALIVE_MS = 15_000;
/** Bytes a client may leave unread on its stream before the Server ends it. */
export const LISTEN_MAX_BUFFERED_BYTES = 1024 * 1024;
/** `_meta` key naming the subscription (the listen request's id) on every message of the stream. */
export const SUBSCRIPTION_ID_META = "io.modelcontextprotocol/subscriptionId";

/** JSON-RPC error code of a listen refused by the per-principal bound (as the v2 SDK's listen router answers). */
const LISTEN_LIMIT_CODE = -32603;

type RequestId = string | number;

export class ListenRefusal extends Error {
  constructor(
    readonly code: number,
    message: string,
    readonly data?: unknown,
    /** The audit row's outcome. */
    readonly outcome: "invalid_input" | "too_many_observers" = "invalid_input",
  ) {
    super(message);
  }
}

/** The task ids of a listen filter, or why the filter is refused. */
export function listenTaskIds(params: Readonly<Record<string, unknown>>, era: Era): string[] {
  const filter = params.notifications;
  if (typeof filter !== "object" || filter === null || Array.isArray(filter)) {
    throw new ListenRefusal(-32602, "params.notifications: required, an object (the subscription filter)");
  }
  const ids = (filter as Record<string, unknown>).taskIds;
  if (ids === undefined) return [];
  if (!Array.isArray(ids) || !ids.every((id) => typeof id === "string")) {
    throw new ListenRefusal(-32602, "params.notifications.taskIds: must be an array of task id strings");
  }
  if (ids.length > LISTEN_MAX_TASK_IDS) {
    throw new ListenRefusal(
      -32602,
      `params.notifications.taskIds: at most ${LISTEN_MAX_TASK_IDS} task ids per listen (got ${ids.length})`,
    );
  }
  if (ids.length > 0 && !declaresTasks(era)) {
    throw new ListenRefusal(
      -32021,
      `params.notifications.taskIds needs the ${TASKS_EXTENSION} extension: declare it in _meta["io.modelcontextprotocol/clientCapabilities"].extensions`,
      { requiredCapabilities: { extensions: { [TASKS_EXTENSION]: {} } } },
    );
  }
  (ids as string[]).forEach((taskId, i) => {
    const why = nonCanonicalTaskId(taskId);
    if (why !== null) throw new ListenRefusal(-32602, `params.notifications.taskIds[${i}] ${why}.`);
  });
  return [...new Set(ids as string[])];
}

interface Subscription {
  principalId: string;
  /** Ends the stream; `graceful` sends the empty listen result first. */
  end(graceful: boolean): void;
}

export class TaskListens {
  readonly #tasks: RunTasks;
  readonly #runs: RunsApi;
  readonly #logger: Logger;
  readonly #serverInfo: unknown;
  readonly #serverInfoMeta: string;
  readonly #observeLimits: ObserveLimits;
  readonly #open = new Set<Subscription>();
  #closed = false;

  constructor(options: {
    tasks: RunTasks;
    runs: RunsApi;
    /** The principal's waiting-observe bound (runs/observe-limits.ts): each open listen holds one of its slots. */
    observeLimits: ObserveLimits;
    logger: Logger;
    /** `_meta` key and value naming this Server on the closing result. */
    serverInfoMeta: string;
    serverInfo: unknown;
  }) {
    this.#tasks = options.tasks;
    this.#runs = options.runs;
    this.#observeLimits = options.observeLimits;
    this.#logger = options.logger;
    this.#serverInfoMeta = options.serverInfoMeta;
    this.#serverInfo = options.serverInfo;
  }

  /** Open streams (all principals). */
  get openCount(): number {
    return this.#open.size;
  }

  /**
   * Answer one `subscriptions/listen`: a refusal throws ListenRefusal before anything is written; otherwise
   * the SSE stream runs until it ends, and the promise resolves with the bytes it carried.
   */
  async serve(
    res: ServerResponse,
    id: RequestId,
    era: Era,
    principal: Principal,
    params: Readonly<Record<string, unknown>>,
  ): Promise<number> {
    const requested = listenTaskIds(params, era);
    // Both bounds are reserved here, before the first await, and given back on every path (the finally
    // below): concurrent listens of one principal cannot all pass a count taken after their reads.
    let mine = 0;
    for (const sub of this.#open) if (sub.principalId === principal.id) mine++;
    if (mine >= LISTEN_MAX_PER_PRINCIPAL) {
      throw new ListenRefusal(
        LISTEN_LIMIT_CODE,
        `Subscription limit reached: at most ${LISTEN_MAX_PER_PRINCIPAL} open subscriptions/listen streams per principal on this Server instance; close one first.`,
        undefined,
        "too_many_observers",
      );
    }
    const slot = this.#observeLimits.acquire(principal.id);
    if (slot === null) {
      throw new ListenRefusal(
        LISTEN_LIMIT_CODE,
        `Too many waiting observe calls and subscriptions/listen streams for this principal (limit ${this.#observeLimits.limit} on this Server instance, each listen counts as one); let one return or close one first.`,
        undefined,
        "too_many_observers",
      );
    }
    // Until the stream is set up, ending it (Server shutdown, the client gone) only marks it.
    let endedEarly = false;
    const sub: Subscription = {
      principalId: principal.id,
      end: () => {
        endedEarly = true;
      },
    };
    this.#open.add(sub);
    res.once("close", () => sub.end(false));
    try {
      return await this.#stream(res, id, principal, requested, sub, () => endedEarly || this.#closed);
    } finally {
      this.#open.delete(sub);
      slot.release();
    }
  }

  async #stream(
    res: ServerResponse,
    id: RequestId,
    principal: Principal,
    requested: readonly string[],
    sub: Subscription,
    endedEarly: () => boolean,
  ): Promise<number> {
    const honored: { taskId: string; runId: string }[] = [];
    for (const taskId of requested) {
      const runId = await this.#tasks.ownedRun(principal, taskId);
      if (runId !== null) honored.push({ taskId, runId });
    }
    if (res.destroyed || res.writableEnded) return 0;

    res.writeHead(200, {
      "Content-Type": "text/event-stream",
      "Cache-Control": "no-cache, no-transform",
      "X-Accel-Buffering": "no",
    });
    const stop = new AbortController();
    let ended = false;
    let bytes = 0;
    const write = (message: Record<string, unknown>) => {
      if (ended || res.writableEnded || res.destroyed) return;
      const frame = `event: message\ndata: ${JSON.stringify({ jsonrpc: "2.0", ...message })}\n\n`;
      bytes += Buffer.byteLength(frame);
      res.write(frame);
      // A client that stops reading does not make the Server hold its notifications.
      if (res.writableLength > LISTEN_MAX_BUFFERED_BYTES) sub.end(false);
    };
    const notify = (method: string, p: Record<string, unknown>) =>
      write({ method, params: { ...p, _meta: { ...(p._meta as object | undefined), [SUBSCRIPTION_ID_META]: id } } });
    sub.end = (graceful) => {
      if (ended) return;
      if (graceful) {
        write({
          id,
          result: {
            resultType: "complete",
            _meta: { [SUBSCRIPTION_ID_META]: id, [this.#serverInfoMeta]: this.#serverInfo },
          },
        });
      }
      ended = true;
      this.#open.delete(sub);
      clearInterval(keepAlive);
      clearTimeout(deadline);
      stop.abort(new Error("listen ended"));
      if (!res.writableEnded) res.end();
    };
    const keepAlive = setInterval(() => {
      if (!ended && !res.writableEnded) res.write(": keepalive\n\n");
    }, LISTEN_KEEPALIVE_MS);
    keepAlive.unref();
    const deadline = setTimeout(() => sub.end(true), LISTEN_MAX_DURATION_MS);
    deadline.unref();
    // The client went away (the listener set in serve calls sub.end): nothing more to send, no closing result.
    notify("notifications/subscriptions/acknowledged", {
      notifications: honored.length > 0 ? { taskIds: honored.map((h) => h.taskId) } : {},
    });
    // The Server began closing while the ids were read: the closing result at once.
    if (endedEarly()) sub.end(true);
    try {
      await Promise.all(
        honored.map(({ runId }) =>
          this.#follow(principal, runId, stop.signal, (task) => notify("notifications/tasks", task)),
        ),
      );
    } catch (err) {
      this.#logger.error({ err: err instanceof Error ? err.name : typeof err }, "task listen failed");
    }
    // Every honored task is terminal (or there were none): nothing more will change.
    sub.end(true);
    return bytes;
  }

  /** Send the task now, then at each change of its status or message, until terminal or `signal`. */
  async #follow(
    principal: Principal,
    runId: string,
    signal: AbortSignal,
    send: (task: Record<string, unknown>) => void,
  ): Promise<void> {
    let token: string | undefined;
    let last = "";
    while (!signal.aborted) {
      const observed = await this.#runs.observe(
        principal,
        token === undefined
          ? { run_id: runId }
          : { run_id: runId, after_observation_token: token, wait_secs: MAX_OBSERVE_WAIT_SECS },
        signal,
      );
      if (signal.aborted || !observed.ok) return;
      token = observed.value.observation_token;
      const task = await this.#tasks.snapshot(principal, runId, observed.value);
      const shape = `${task.status}\n${task.statusMessage}`;
      if (shape !== last) {
        last = shape;
        send(task);
      }
      if (isTerminalTaskStatus(task.status)) return;
    }
  }

  /** End every open stream with the closing result (Server shutdown). */
  closeAll(): void {
    this.#closed = true;
    for (const sub of [...this.#open]) sub.end(true);
  }
}
