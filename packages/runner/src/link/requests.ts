/**
 * The Runner's answers to the Server's requests (run.start, run.sync, run.cancel, run.changes, run.apply), through the
 * RunService only. link/link.ts owns the connection and sends what `reply` is given; every request
 * gets exactly one answer, an `error` frame when the service fails.
 */
import {
  eventBatches,
  MAX_EVENTS_PER_SYNC,
  type RunEvent,
  type RunnerFrame,
  type RunSummary,
  type ServerFrame,
  TOMBSTONE_MESSAGE,
} from "@webcodex/protocol";
import type { RunService } from "../runs/service.js";

export type Request = Extract<ServerFrame, { request_id: string }>;

export interface AnswerDeps {
  service: RunService;
  /** Starts still being answered: the link waits for them (bounded) before it closes. */
  starts: Set<Promise<unknown>>;
  /** Send the one answer (the link checks it against the protocol first). */
  reply: (frame: RunnerFrame) => void;
  /** The service failed: log it and answer `internal`. */
  internal: (err: unknown) => void;
}

/** Answer `req` (its request id `rid`) through `deps.reply`. */
export function answerRequest(req: Request, rid: string, deps: AnswerDeps): void {
  const { reply, internal } = deps;
  switch (req.type) {
    case "run.start": {
      const { type: _t, request_id: _r, ...request } = req;
      const p = deps.service.start(request).then((out) => {
        if (out.ok) reply({ type: "run.start.result", request_id: rid, run: out.run, created: out.created });
        else
          reply({
            type: "error",
            request_id: rid,
            code: out.code,
            message: out.message.slice(0, 512),
            ...(out.run ? { run: out.run } : {}),
            ...(out.tombstone ? { tombstone: out.tombstone } : {}),
            ...(out.capacity_reason ? { capacity_reason: out.capacity_reason } : {}),
          });
      }, internal);
      deps.starts.add(p);
      void p.finally(() => deps.starts.delete(p));
      return;
    }
    case "run.sync": {
      try {
        const res = deps.service.sync(req.run_id, req.after_seq, req.max_events);
        if (!res) reply(absent(deps.service, rid, req.run_id));
        else reply(fitSync(rid, res.run, res.events, res.has_more));
      } catch (err) {
        internal(err);
      }
      return;
    }
    case "run.cancel":
      deps.service.cancel(req.run_id).then((res) => {
        if (!res) reply(absent(deps.service, rid, req.run_id));
        else
          reply({
            type: "run.cancel.result",
            request_id: rid,
            run: res.run,
            cancel_requested: res.cancel_requested,
            already_terminal: res.already_terminal,
          });
      }, internal);
      return;
    case "run.changes":
      // Project content: answered to the Server, never logged (workspace/changes.ts).
      deps.service.changes(req.run_id, Number(req.cursor ?? "0"), req.max_bytes).then((res) => {
        if (!res) reply(absent(deps.service, rid, req.run_id));
        else if (res.ok) reply({ type: "run.changes.result", request_id: rid, changes: res.changes });
        else reply({ type: "error", request_id: rid, code: res.code, message: res.message });
      }, internal);
      return;
    case "run.apply":
      // Paths in the answer are project content: answered to the Server, never logged (workspace/apply.ts).
      deps.service.apply(req.run_id, req.target_branch, req.key_hash).then((res) => {
        if (!res) reply(absent(deps.service, rid, req.run_id));
        else if (res.ok) reply({ type: "run.apply.result", request_id: rid, apply: res.apply });
        else if ("refusal" in res) reply({ type: "run.apply.result", request_id: rid, refusal: res.refusal });
        else reply({ type: "error", request_id: rid, code: res.code, message: res.message });
      }, internal);
      return;
    default: {
      const never: never = req;
      void never;
    }
  }
}

/**
 * The answer for a run the store holds no row for: `pruned` with its tombstone when this store admitted
 * it once, else `not_found` — "this store never admitted that run", the only answer that lets the
 * Server close a record as never admitted.
 */
function absent(service: RunService, rid: string, runId: string): RunnerFrame {
  const tombstone = service.tombstone(runId);
  if (tombstone) return { type: "error", request_id: rid, code: "pruned", message: TOMBSTONE_MESSAGE, tombstone };
  return { type: "error", request_id: rid, code: "not_found", message: "No such run on this Runner." };
}

/** A sync result that fits one frame: its first batch (@webcodex/protocol batches.ts); has_more when events were left. */
function fitSync(rid: string, run: RunSummary, events: RunEvent[], hasMore: boolean): RunnerFrame {
  const [first = []] = eventBatches(events, { maxEvents: MAX_EVENTS_PER_SYNC });
  return {
    type: "run.sync.result",
    request_id: rid,
    run,
    events: first,
    has_more: hasMore || first.length < events.length,
  };
}
