/**
 * The agent's permission requests during one turn (design §4.3). The Runner grants nothing: every request of the
 * run's own session after the barrier enters the run's events and waits until its deadline
 * (`[acp] permission_timeout_secs`), the run's cancel, or its connection closing, then is answered `cancelled`.
 * One asked while the run is being cancelled is answered at once; beyond MAX_PENDING_PERMISSIONS waiting, one is
 * answered at once with no event and only counted. While any waits the run is `waiting_permission`. Why the first
 * was answered names the run's terminal message (acp/terminal.ts `promptTerminal`).
 */
import type { RequestPermissionRequest, RequestPermissionResponse } from "@agentclientprotocol/sdk";
import type { EventNormalizer } from "../events/normalize.js";
import type { Logger } from "../logger.js";
import type { CancelReason, PermissionAnswer } from "./terminal.js";

/**
 * Permission requests a run may have waiting at once. Each holds a waiter, a
 * timer, a ring event and a log line; beyond this bound a request is answered
 * `cancelled` at once, with no event, and only counted (ignored_updates).
 */
export const MAX_PENDING_PERMISSIONS = 16;

/** The one answer the Runner gives. */
function cancelled(): RequestPermissionResponse {
  return { outcome: { outcome: "cancelled" } };
}

export interface PermissionGateOptions {
  runId: string;
  log: Logger;
  /** `[acp] permission_timeout_secs` in ms: how long one request waits. */
  timeoutMs: number;
  /** The run's state while requests wait: `waiting_permission` with the first, `running` after the last. */
  state: (state: "waiting_permission" | "running") => void;
  /** Whether the turn has ended: no state is told then. */
  ended: () => boolean;
}

export class PermissionGate {
  readonly #o: PermissionGateOptions;
  readonly #waiters = new Set<(why: CancelReason) => void>();
  #pending = 0;
  #waiting = false;
  /** Requests answered `cancelled` at once because MAX_PENDING_PERMISSIONS were waiting. */
  #refused = 0;
  /** Why the first request was answered `cancelled` (for the terminal message). */
  #answered: PermissionAnswer | null = null;

  constructor(options: PermissionGateOptions) {
    this.#o = options;
  }

  get refused(): number {
    return this.#refused;
  }

  get answered(): PermissionAnswer | null {
    return this.#answered;
  }

  /** The run is being cancelled: every waiting request is answered now. */
  cancel(reason: CancelReason): void {
    for (const wake of [...this.#waiters]) wake(reason);
  }

  /**
   * Answer a request of the dispatched run's session (the turn refuses the others): recorded by `normalizer`,
   * waited on, answered `cancelled`. `cancelReason`: the run's, if it is being cancelled.
   */
  async answer(
    params: RequestPermissionRequest,
    signal: AbortSignal,
    normalizer: EventNormalizer,
    cancelReason: CancelReason | null,
  ): Promise<RequestPermissionResponse> {
    const { runId, log } = this.#o;
    if (cancelReason !== null) {
      this.#answered ??= cancelReason;
      return cancelled();
    }
    if (this.#pending >= MAX_PENDING_PERMISSIONS) {
      if (this.#refused++ === 0) {
        log.warn({ run_id: runId, pending: this.#pending }, "too many pending permission requests");
      }
      normalizer.ignore();
      return cancelled();
    }
    normalizer.permissionRequest(params);
    this.#pending++;
    this.#waiting = true;
    this.#o.state("waiting_permission");
    log.info({ run_id: runId }, "permission requested");

    const why = await new Promise<PermissionAnswer | "closed">((resolve) => {
      const timer = setTimeout(() => finish("permission_deadline"), this.#o.timeoutMs);
      const onAbort = () => finish("closed");
      const finish = (w: PermissionAnswer | "closed") => {
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        this.#waiters.delete(finish);
        resolve(w);
      };
      signal.addEventListener("abort", onAbort, { once: true });
      this.#waiters.add(finish);
    });
    this.#pending--;
    if (why !== "closed") this.#answered ??= why;
    if (this.#pending === 0 && this.#waiting && !this.#o.ended()) {
      this.#waiting = false;
      this.#o.state("running");
    }
    log.info({ run_id: runId, answered: "cancelled", because: why }, "permission answered");
    return cancelled();
  }
}
