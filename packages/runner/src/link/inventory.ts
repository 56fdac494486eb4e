/**
 * The inventory a hello carries: the service's runs, each checked against the protocol schema (a
 * row the Server would reject is left out and logged), fitted into one frame (open runs first).
 */
import {
  describeFirstIssue,
  isTerminalState,
  MAX_FRAME_BYTES,
  MAX_INVENTORY_RUNS,
  type RunnerFrame,
  RunSummary,
} from "@webcodex/protocol";
import type { Logger } from "pino";
import type { RunService } from "../runs/service.js";

/** The service's inventory, schema-checked and fitted into one frame built on `base` (whose list is empty). */
export function inventoryFor(service: RunService, log: Logger, base: RunnerFrame): RunSummary[] {
  const runs = validRuns(log, base.type, service.inventory().slice(0, MAX_INVENTORY_RUNS));
  const budget = MAX_FRAME_BYTES - Buffer.byteLength(JSON.stringify(base), "utf8");
  const fitted = fitInventory(runs, budget);
  if (fitted.length < runs.length) {
    log.warn(
      { type: base.type, kept: fitted.length, left_out: runs.length - fitted.length },
      "inventory larger than one frame; oldest terminal runs left out (the Server asks for them one by one with run.sync)",
    );
  }
  return fitted;
}

/** Inventory rows the protocol accepts; each other row is logged (frame type, first bad path) and left out. */
function validRuns(log: Logger, type: RunnerFrame["type"], runs: RunSummary[]): RunSummary[] {
  return runs.filter((run) => {
    const checked = RunSummary.safeParse(run);
    if (checked.success) return true;
    const { path } = describeFirstIssue(checked.error);
    log.error({ type, run_id: run.run_id, path }, "inventory row violates the protocol; left out");
    return false;
  });
}

/**
 * The runs that fit in `budgetBytes` of serialized list: every non-terminal run first (they are bounded by
 * max_concurrent_runs), then terminal runs in the given (newest-first) order. Order of the input is kept.
 */
export function fitInventory(runs: readonly RunSummary[], budgetBytes: number): RunSummary[] {
  let left = budgetBytes;
  const keep = new Set<RunSummary>();
  const open = runs.filter((r) => !isTerminalState(r.state));
  const done = runs.filter((r) => isTerminalState(r.state));
  for (const run of [...open, ...done]) {
    const size = Buffer.byteLength(JSON.stringify(run), "utf8") + 1;
    if (size > left) continue;
    left -= size;
    keep.add(run);
  }
  return runs.filter((r) => keep.has(r));
}
