/**
 * Per-stage timings from the Runner's own structured log (pino JSON lines).
 * Any line carrying an object of numbers under one of TIMING_KEYS is taken as
 * one run's stage durations in ms, e.g.
 *   {"msg":"run timings","run_id":"…","timings_ms":{"spawn":12.1,"initialize":30.2,…}}
 * Returns { stage: summary } over all runs, or null when the Runner logs none.
 */
import { existsSync, readFileSync } from "node:fs";
import { summarize } from "./stats.mjs";

const TIMING_KEYS = ["timings_ms", "stage_ms", "stages_ms", "timings", "stages"];

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
    const key = TIMING_KEYS.find((k) => entry[k] && typeof entry[k] === "object");
    if (!key) continue;
    runs++;
    for (const [stage, ms] of Object.entries(entry[key])) {
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
