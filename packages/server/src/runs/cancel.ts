/**
 * Cancellation (design §6.3 cancel_coding_agent): idempotent. The first
 * cancel of a live run sends `run.cancel` once and records
 * `cancel_forwarded` on the Runner's answer; a cancel whose delivery is
 * unknown stays pending and is sent again after the runner's next hello.
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
  /** Runs whose cancel was sent but whose delivery is unknown (connection closed or request timed out). */
  readonly #pendingCancels = new Set<string>();

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
    const wasPending = this.#pendingCancels.has(rec.run_id);
    const res = await this.#sendCancel(rec.run_id, runner);
    if (!res.ok && (res.reason === "not_sent" || res.reason === "busy")) {
      if (!wasPending) this.#pendingCancels.delete(rec.run_id);
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
   * Send run.cancel and record what is known. cancel_forwarded is set only on run.cancel.result; a
   * cancel whose delivery is unknown (closed, timeout) stays pending and is sent again after the
   * runner's next hello — safe, because the Runner sends session/cancel at most once per run.
   */
  async #sendCancel(runId: string, runner: LiveRunner): Promise<RequestOutcome> {
    this.#pendingCancels.add(runId);
    const mark = this.#ctx.startMark();
    const res = await runner.conn.request({ type: "run.cancel", run_id: runId });
    if (!res.ok) return res;
    this.#pendingCancels.delete(runId);
    if (res.frame.type === "run.cancel.result") {
      await this.#ctx.store.update(runId, { cancel_forwarded: true });
      await this.#ctx.persist(runId, res.frame.run);
    } else if (res.frame.type === "error" && res.frame.code === "not_found") {
      await this.#ctx.closeIfNeverAdmitted(runId, runner, mark);
    } else if (res.frame.type === "error" && res.frame.tombstone) {
      await this.#ctx.applyTombstone(runId, res.frame.tombstone);
    }
    return res;
  }

  /** After a hello (and its reconciliation): send again the cancels of this runner whose delivery is unknown. */
  async reforward(conn: RunnerConnection): Promise<void> {
    for (const runId of [...this.#pendingCancels]) {
      const rec = await this.#ctx.store.get(runId);
      if (!rec || rec.cancel_forwarded || isTerminalState(rec.state)) {
        this.#pendingCancels.delete(runId);
        continue;
      }
      const runner = this.#ctx.registry.live(rec.runner_id);
      if (rec.runner_id !== conn.runnerId || runner?.conn !== conn) continue;
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
