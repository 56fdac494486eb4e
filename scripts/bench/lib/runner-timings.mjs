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

/**
 * Until the Runner logs stage timings itself: a coarse breakdown from its
 * info lines ("run admitted", "agent spawned"; pino `time`, 1 ms wall clock)
 * against the bench's send time and the ledger's hr_ms for each run.
 * runs: [{ run_id, sent_hr, ledger_hr }]
 */
export function derivedStages(logFile, runs) {
  if (!existsSync(logFile)) return null;
  const admitted = new Map();
  const spawned = new Map();
  for (const line of readFileSync(logFile, "utf8").split("\n")) {
    if (!line.startsWith("{")) continue;
    let entry;
    try {
      entry = JSON.parse(line);
    } catch {
      continue;
    }
    const at = typeof entry.time === "number" ? entry.time : Date.parse(entry.time);
    if (!entry.run_id || !Number.isFinite(at)) continue;
    if (entry.msg === "run admitted" && !admitted.has(entry.run_id)) admitted.set(entry.run_id, at);
    if (entry.msg === "agent spawned" && !spawned.has(entry.run_id)) spawned.set(entry.run_id, at);
  }
  const segs = { "client → runner admitted": [], "admitted → agent spawned": [], "spawned → prompt at agent": [] };
  for (const r of runs) {
    const a = admitted.get(r.run_id);
    const s = spawned.get(r.run_id);
    if (a === undefined || s === undefined) continue;
    segs["client → runner admitted"].push(a - r.sent_hr);
    segs["admitted → agent spawned"].push(s - a);
    segs["spawned → prompt at agent"].push(r.ledger_hr - s);
  }
  if (segs["client → runner admitted"].length === 0) return null;
  return Object.fromEntries(Object.entries(segs).map(([k, v]) => [k, summarize(v)]));
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
