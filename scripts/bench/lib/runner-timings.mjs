/**
 * Per-stage timings from the Runner's own structured log (pino JSON lines):
 * the Runner writes one `run timings` line per dispatched run (run-manager.ts),
 *   {"msg":"run timings","run_id":"…","timings_ms":{"spawn":12.1,"initialize":30.2,…}}
 * Returns { stage: summary } over all runs, or null when the log holds none.
 */
import { existsSync, readFileSync } from "node:fs";
import { summarize } from "./stats.mjs";

export function runnerStageTimings(logFile) {
  if (!existsSync(logFile)) return null;
  const perStage = new Map();
  let runs = 0;
  for (const line of readFileSync(logFile, "utf8").split("\n")) {
    if (!line.startsWith("{")) continue;
    let entry;
    try {
      entry = JSON.parse(line);
    } catch {
      continue;
    }
    if (entry.msg !== "run timings" || typeof entry.timings_ms !== "object" || entry.timings_ms === null) continue;
    runs++;
    for (const [stage, ms] of Object.entries(entry.timings_ms)) {
      if (typeof ms !== "number") continue;
      if (!perStage.has(stage)) perStage.set(stage, []);
      perStage.get(stage).push(ms);
    }
  }
  if (runs === 0) return null;
  const out = {};
  for (const [stage, samples] of perStage) out[stage] = summarize(samples);
  return out;
}

/** Wall-clock ms (pino `time`) of the Runner's first log line with `msg` for `runId`, or null. */
export function runnerLogTime(logFile, runId, msg) {
  if (!existsSync(logFile)) return null;
  for (const line of readFileSync(logFile, "utf8").split("\n")) {
    if (!line.includes(runId) || !line.includes(msg)) continue;
    try {
      const entry = JSON.parse(line);
      if (entry.run_id !== runId || entry.msg !== msg) continue;
      const at = typeof entry.time === "number" ? entry.time : Date.parse(entry.time);
      if (Number.isFinite(at)) return at;
    } catch {
      // not JSON
    }
  }
  return null;
}

/** run_id → its `run timings` stages (ms each, consecutive laps from just before the spawn to the prompt written). */
export function runnerRunTimings(logFile) {
  const out = new Map();
  if (!existsSync(logFile)) return out;
  for (const line of readFileSync(logFile, "utf8").split("\n")) {
    if (!line.startsWith("{") || !line.includes('"run timings"')) continue;
    try {
      const entry = JSON.parse(line);
      if (entry.msg !== "run timings" || typeof entry.timings_ms !== "object" || entry.timings_ms === null) continue;
      out.set(entry.run_id, entry.timings_ms);
    } catch {
      // not JSON
    }
  }
  return out;
}
