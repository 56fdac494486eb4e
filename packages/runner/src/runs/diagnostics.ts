/**
 * Runner-local diagnostics of a run (issue 12 §4): the redacted tail of the
 * agent's stderr (at most STDERR_TAIL_BYTES, kept by process/stderr-tail.ts),
 * its exit, the run's setup stage and timings and its terminal state, as one JSON file per run:
 * `<state_dir>/diagnostics/<run_id>.json`, mode 0600 in a 0700 directory.
 * Written when the run's process tree is gone, or when its agent is kept for a follow-up (runs/kept-agents.ts:
 * no exit then, the stderr tail so far); removed when retention prunes
 * the run's row. Never sent to the Server (the link never reads it); the
 * Runner's log names the file in the line of a failed or lost run, and
 * `webcodex-runner diagnose RUN_ID` prints it.
 */
import { chmodSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { RUN_ID_PATTERN, type RunSummary } from "@webcodex/protocol";
import type { RunTimings } from "./timings.js";

export const DIAGNOSTICS_DIR = "diagnostics";

export interface RunDiagnostics {
  run_id: string;
  state: RunSummary["state"];
  execution_state: RunSummary["execution_state"];
  failure_kind: RunSummary["failure_kind"];
  stop_reason: RunSummary["stop_reason"];
  message: string | null;
  /** The setup stage the run was in when it ended (prompt once dispatched). */
  stage: string;
  /** Setup stage durations (ms) as far as the run got. */
  timings_ms: RunTimings;
  exit_code: number | null;
  exit_signal: string | null;
  stderr_bytes: number;
  /** The last STDERR_TAIL_BYTES of the agent's stderr, redacted like event text. */
  stderr_tail: string;
  written_at: string;
}

export function diagnosticsDir(stateDir: string): string {
  return join(stateDir, DIAGNOSTICS_DIR);
}

/** The file of a run, or null for a string that is not a run id (never a path outside the directory). */
export function diagnosticsFile(dir: string, runId: string): string | null {
  return RUN_ID_PATTERN.test(runId) ? join(dir, `${runId}.json`) : null;
}

export function writeDiagnostics(dir: string, diagnostics: RunDiagnostics): string {
  const file = diagnosticsFile(dir, diagnostics.run_id);
  if (!file) throw new Error("diagnostics: not a run id");
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  writeFileSync(file, `${JSON.stringify(diagnostics, null, 2)}\n`, { mode: 0o600 });
  chmodSync(file, 0o600);
  return file;
}

export function readDiagnostics(dir: string, runId: string): RunDiagnostics | null {
  const file = diagnosticsFile(dir, runId);
  if (!file) return null;
  try {
    return JSON.parse(readFileSync(file, "utf8")) as RunDiagnostics;
  } catch {
    return null;
  }
}

/** Remove the files of pruned runs (missing files are fine). */
export function removeDiagnostics(dir: string, runIds: readonly string[]): void {
  for (const runId of runIds) {
    const file = diagnosticsFile(dir, runId);
    if (file) rmSync(file, { force: true });
  }
}
