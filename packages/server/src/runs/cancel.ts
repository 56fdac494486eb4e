/**
 * Cancellation (design §6.3 cancel_coding_agent): idempotent. The first
 * cancel of a live run sends `run.cancel` once and records
 * `cancel_forwarded` on the Runner's answer; a cancel whose delivery is
 * unknown stays pending in its record (`cancel_pending`) and is sent again
 * after the runner's next hello — on whichever instance accepts it, this
 * one after a restart included.
 */
import { isTerminalState, RunId } from "@webcodex/protocol";
import type { RequestOutcome, RunnerConnection } from "../link/hub.js";
import type { LiveRunner } from "../link/registry.js";
import { missingScopes } from "../principals/authority.js";
import type { Principal } from "../principals/principal.js";
import type { ApiResult, CancelOutput } from "./api.js";
import { fail, type RunContext } from "./context.js";

export class Cancellation {
  readonly #ctx: RunContext;

  constructor(ctx: RunContext) {
    this.#ctx = ctx;
  }

  async cancel(principal: Principal, input: { run_id: string }): Promise<ApiResult<CancelOutput>> {
    if (!RunId.safeParse(input.run_id).success) return fail("invalid_input", "run_id is not a run id.", "fix_input");
    const denied = missingScopes(principal, ["coding_agent:run"], "Cancelling a coding agent");
    if (denied) return { ok: false, error: denied };
    let rec = await this.#ctx.owned(principal, input.run_id);
    if (!rec) return fail("not_found", `No run ${input.run_id}.`, "none");
    const inflight = this.#ctx.starting.get(rec.run_id);
    if (inflight) {
      await inflight.catch(() => undefined);
      rec = (await this.#ctx.store.get(rec.run_id)) ?? rec;
    }
    if (isTerminalState(rec.state)) {
      return {
        ok: true,
        value: { run_id: rec.run_id, state: rec.state, cancel_requested: false, already_terminal: true },
      };
    }
    if (rec.cancel_forwarded) {
      return {
        ok: true,
        value: { run_id: rec.run_id, state: rec.state, cancel_requested: true, already_terminal: false },
      };
    }
    const runner = await this.#ctx.registry.lookup(rec.runner_id);
    if (!runner) {
      return fail(
        "runner_unavailable",
        "The run's Runner is offline; the cancel was not delivered. Try again later.",
        "wait",
      );
    }
    const wasPending = rec.cancel_pending;
    const res = await this.#sendCancel(rec.run_id, runner);
    if (!res.ok && (res.reason === "not_sent" || res.reason === "busy")) {
      // This one surely did not leave; an earlier one whose delivery is unknown still may have.
      if (!wasPending) await this.#ctx.store.update(rec.run_id, { cancel_pending: false });
      return fail("runner_unavailable", "The cancel could not be delivered to the Runner. Try again.", "wait");
    }
    if (res.ok && res.frame.type === "run.cancel.result") {
      const latest = (await this.#ctx.store.get(rec.run_id)) ?? rec;
      this.#ctx.log.info({ run_id: rec.run_id }, "cancel forwarded");
      return {
        ok: true,
        value: {
          run_id: rec.run_id,
          state: latest.state,
          cancel_requested: res.frame.cancel_requested || !res.frame.already_terminal,
          already_terminal: res.frame.already_terminal,
        },
      };
    }
    const latest = (await this.#ctx.store.get(rec.run_id)) ?? rec;
    if (isTerminalState(latest.state)) {
      // E.g. not_found settled it as never admitted: there is nothing left to cancel.
      return {
        ok: true,
        value: { run_id: rec.run_id, state: latest.state, cancel_requested: false, already_terminal: true },
      };
    }
    return {
      ok: true,
      value: { run_id: rec.run_id, state: latest.state, cancel_requested: true, already_terminal: false },
    };
  }

  /**
   * Send run.cancel and record what is known. The record says `cancel_pending` before the frame leaves;
   * cancel_forwarded is set only on run.cancel.result. A cancel whose delivery is unknown (closed,
   * timeout) stays pending and is sent again after the runner's next hello — safe, because the Runner
   * sends session/cancel at most once per run.
   */
  async #sendCancel(runId: string, runner: LiveRunner): Promise<RequestOutcome> {
    await this.#ctx.store.update(runId, { cancel_pending: true });
    const mark = this.#ctx.startMark();
    const res = await runner.conn.request({ type: "run.cancel", run_id: runId });
    if (!res.ok) return res;
    if (res.frame.type === "run.cancel.result") {
      await this.#ctx.store.update(runId, { cancel_forwarded: true, cancel_pending: false });
      await this.#ctx.persist(runId, res.frame.run);
      return res;
    }
    // The Runner answered: an unknown run or one it keeps only as a tombstone has nothing to cancel.
    await this.#ctx.store.update(runId, { cancel_pending: false });
    if (res.frame.type === "error" && res.frame.code === "not_found") {
      await this.#ctx.closeIfNeverAdmitted(runId, runner, mark);
    } else if (res.frame.type === "error" && res.frame.tombstone) {
      await this.#ctx.applyTombstone(runId, res.frame.tombstone);
    }
    return res;
  }

  /**
   * After a hello (and its reconciliation) on this instance: send again the cancels of this runner whose
   * delivery is unknown, whichever instance sent them (`cancel_pending` in their records).
   */
  async reforward(conn: RunnerConnection): Promise<void> {
    for (const rec of await this.#ctx.store.listPendingCancels(conn.runnerId)) {
      const runId = rec.run_id;
      const runner = this.#ctx.registry.live(rec.runner_id);
      if (runner?.conn !== conn) return; // replaced meanwhile: the newer hello re-forwards
      this.#ctx.log.info(
        { run_id: runId, runner_id: rec.runner_id },
        "re-forwarding a cancel whose delivery was unknown",
      );
      this.#sendCancel(runId, runner).catch((err: unknown) =>
        this.#ctx.log.error({ run_id: runId, err: (err as Error).message }, "re-forwarding a cancel failed"),
      );
    }
  }
}
