/**
 * A start's answer to its caller: the one builder of a success (the run's state and an observation token from
 * seq 0), and the replay of a record that already answers the start (the same key again, or a record another
 * instance or a reconciliation settled first).
 */
import type { Principal } from "../principals/principal.js";
import type { AdmissionRecord } from "../state/record.js";
import type { ApiResult, StartOutput } from "./api.js";
import { fail, type RunContext } from "./context.js";
import { START_IN_PROGRESS_MESSAGE } from "./start-refusals.js";

export type RunStatus = Pick<StartOutput, "state" | "execution_state">;

/** A start whose answer never came and whose record vanished meanwhile: what it reports. */
export const STARTING: RunStatus = { state: "starting", execution_state: "not_started" };

/** The one builder of a start's success: the run's state and an observation token from seq 0. */
export function answer(
  ctx: RunContext,
  runId: string,
  status: RunStatus,
  replayed: boolean,
  instance: string,
): ApiResult<StartOutput> {
  return {
    ok: true,
    value: {
      run_id: runId,
      state: status.state,
      execution_state: status.execution_state,
      replayed,
      observation_token: ctx.tokens.issue({ run_id: runId, instance, seq: 0 }),
    },
  };
}

/** The record as it is now, answered as a replay (another instance or a reconciliation settled it first). */
export async function replayCurrent(
  ctx: RunContext,
  runId: string,
  principal: Principal,
): Promise<ApiResult<StartOutput>> {
  const rec = await ctx.store.get(runId);
  if (!rec) return fail("start_in_progress", START_IN_PROGRESS_MESSAGE, "retry_same");
  return replay(ctx, rec, principal);
}

export function replay(ctx: RunContext, rec: AdmissionRecord, principal: Principal): ApiResult<StartOutput> {
  ctx.log.info({ run_id: rec.run_id, principal_id: principal.id }, "start replayed");
  return answer(ctx, rec.run_id, rec, true, tokenInstance(ctx, rec));
}

/** The agent instance a replayed run's token names: its mirror's, else its runner's live one, else its record's. */
function tokenInstance(ctx: RunContext, rec: AdmissionRecord): string {
  const mirror = ctx.mirrors.get(rec.run_id);
  return (
    mirror?.instance ??
    ctx.registry.live(rec.runner_id)?.agentInstanceId ??
    rec.agent_instance_id ??
    "no_runner_instance"
  );
}
