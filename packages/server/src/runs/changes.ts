/**
 * get_coding_agent_changes (design §16): one page of a worktree run's recorded change, asked of the run's Runner
 * (`run.changes`, through the instance holding its link on a PostgreSQL state) for the run's owner only — the
 * ownership rule of observe: another principal's run looks exactly like no run. The answer is project content:
 * it goes back to the caller and nowhere else — never the state database, the audit or a log line (which carry
 * the run id and an outcome code only).
 */
import {
  type ChangesToolInput,
  DEFAULT_CHANGES_PAGE_BYTES,
  MAX_CHANGES_PAGE_BYTES,
  MIN_CHANGES_PAGE_BYTES,
  type RunChanges,
  RunId,
} from "@webcodex/protocol";
import { missingScopes } from "../principals/authority.js";
import type { Principal } from "../principals/principal.js";
import type { ApiResult } from "./api.js";
import { fail, type RunContext } from "./context.js";

/** Longest the Runner may take to read one page of a change. */
export const CHANGES_TIMEOUT_MS = 60_000;

export class ChangesReader {
  readonly #ctx: RunContext;

  constructor(ctx: RunContext) {
    this.#ctx = ctx;
  }

  async changes(principal: Principal, input: ChangesToolInput): Promise<ApiResult<RunChanges>> {
    if (!RunId.safeParse(input.run_id).success) return fail("invalid_input", "run_id is not a run id.", "fix_input");
    const denied = missingScopes(principal, ["coding_agent:run"], "Reading a coding agent's changes");
    if (denied) return { ok: false, error: denied };
    const rec = await this.#ctx.owned(principal, input.run_id, true);
    if (!rec) return fail("not_found", `No run ${input.run_id}.`, "none");
    if (rec.admission !== "admitted" && rec.admission !== "sent") {
      return fail("not_found", `Run ${input.run_id} was never admitted by its Runner: it has no change.`, "none");
    }
    return this.#ask(rec, Math.min(input.max_bytes ?? DEFAULT_CHANGES_PAGE_BYTES, MAX_CHANGES_PAGE_BYTES), {
      cursor: input.cursor,
      timeoutMs: CHANGES_TIMEOUT_MS,
    });
  }

  /**
   * The operator console's read (design §15): the files of a run's recorded change, whoever owns the run —
   * asked with the smallest diff page, which is dropped here: the diff is project content for the owner only,
   * and the console shows paths, statuses and counts. `timeoutMs` bounds the wait for the Runner.
   */
  async filesForOperator(runId: string, timeoutMs: number): Promise<ApiResult<Omit<RunChanges, "diff">>> {
    const rec = await this.#ctx.store.peek(runId);
    if (!rec || (rec.admission !== "admitted" && rec.admission !== "sent")) {
      return fail("not_found", `No admitted run ${runId}.`, "none");
    }
    const res = await this.#ask(rec, MIN_CHANGES_PAGE_BYTES, { cursor: undefined, timeoutMs });
    if (!res.ok) return res;
    const { diff: _diff, ...files } = res.value;
    return { ok: true, value: files };
  }

  async #ask(
    rec: { run_id: string; runner_id: string },
    maxBytes: number,
    opts: { cursor: string | undefined; timeoutMs: number },
  ): Promise<ApiResult<RunChanges>> {
    const runner = await this.#ctx.registry.lookup(rec.runner_id);
    if (!runner) {
      return fail(
        "runner_unavailable",
        "The run's Runner is offline; its change is kept there. Try again later.",
        "wait",
      );
    }
    const res = await runner.conn.request(
      {
        type: "run.changes",
        run_id: rec.run_id,
        max_bytes: maxBytes,
        ...(opts.cursor !== undefined ? { cursor: opts.cursor } : {}),
      },
      opts.timeoutMs,
    );
    if (!res.ok) {
      return fail(
        "runner_unavailable",
        "The run's Runner did not answer in time; nothing changed. Try again.",
        "retry_same",
      );
    }
    const frame = res.frame;
    if (frame.type === "run.changes.result" && frame.changes.run_id === rec.run_id)
      return { ok: true, value: frame.changes };
    if (frame.type === "error") {
      if (frame.code === "invalid_request") {
        return fail(
          "invalid_input",
          `Run ${rec.run_id} has no recorded change: its project does not use workspaces (workspace = "shared").`,
          "none",
        );
      }
      if (frame.code === "not_found" || frame.code === "pruned") {
        return fail("not_found", `The Runner keeps no change of run ${rec.run_id} any more.`, "none");
      }
    }
    this.#ctx.log.warn({ run_id: rec.run_id, type: frame.type }, "unexpected answer to run.changes");
    return fail("internal", "The Runner could not read the run's change. Try again later.", "retry_same");
  }
}
