#!/usr/bin/env node
/**
 * `npm run bench [-- --quick] [-- --only start,engines,follow-up,webhooks,workspaces,throughput,wakeup,cluster,fanout,cluster-fanout,links,barrier,dispatch,peer]`
 *   `[-- --profile] [-- --keep]`
 *   `[-- --grid NS:MS] [-- --sdk-observers]`
 *
 * Measures our stack (Server + Runner + fake agent as real processes, driven
 * by a real MCP client) and a bare ACP SDK baseline in the same run, prints a
 * table with PASS/MISS per target and writes bench-results/latest.json.
 * A MISS never fails the exit code; only a crash of the harness itself does.
 */
import { appendFileSync, existsSync, mkdirSync, writeFileSync } from "node:fs";
import { loadavg } from "node:os";
import { basename, dirname, join } from "node:path";
import { parseArgs } from "node:util";
import { historyLine } from "./lib/history.mjs";
import { machineInfo } from "./lib/machine.mjs";
import { BENCH_DIR, fakeAgentBuilt, REPO } from "./lib/paths.mjs";
import { writePicture } from "./lib/picture.mjs";
import { evaluateTargets, render, TARGETS } from "./lib/report.mjs";
import { ratio, round } from "./lib/stats.mjs";
import { removeTempDirs } from "./lib/tmp.mjs";
import { launchStack } from "./stack.mjs";
import * as clusterFanout from "./suites/cluster-fanout.mjs";
import * as dispatch from "./suites/dispatch.mjs";
import * as fanout from "./suites/fanout.mjs";
import * as links from "./suites/links.mjs";
import * as peer from "./suites/peer.mjs";
import * as startDispatch from "./suites/start-dispatch.mjs";
import * as throughput from "./suites/throughput.mjs";
import * as wakeup from "./suites/wakeup.mjs";
import * as webhooks from "./suites/webhooks.mjs";
import * as workspaces from "./suites/workspaces.mjs";

const SECTIONS = [
  "start",
  "engines",
  "follow-up",
  "webhooks",
  "workspaces",
  "throughput",
  "wakeup",
  "cluster",
  "fanout",
  "cluster-fanout",
  "links",
  "barrier",
  "dispatch",
  "peer",
];
/**
 * Part of a full run, in --quick only when named in --only: `peer` installs acpx + Node 22 (~50 MB) on first
 * use; `cluster-fanout` and `links` each start PostgreSQL and several Servers, more than --quick's 2 minutes hold.
 */
const NOT_QUICK_BY_DEFAULT = new Set(["peer", "cluster-fanout", "links", "follow-up"]);
const QUICK_DEFAULT_SECTIONS = SECTIONS.filter((s) => !NOT_QUICK_BY_DEFAULT.has(s));

const { values: opts } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    only: { type: "string" },
    profile: { type: "boolean", default: false },
    keep: { type: "boolean", default: false },
    out: { type: "string", default: join(REPO, "bench-results/latest.json") },
    /** Fan-out grid override, "NS:MS", e.g. --grid 10:500 or --grid 1,10:10,100,500 */
    grid: { type: "string" },
    /** Fan-out observers use the SDK Client instead of the lean node:http MCP client (lib/mcp-lean.mjs). */
    "sdk-observers": { type: "boolean", default: false },
  },
  strict: true,
});
const quick = opts.quick;
const only = new Set(opts.only ? opts.only.split(",").map((s) => s.trim()) : quick ? QUICK_DEFAULT_SECTIONS : SECTIONS);
for (const s of only)
  if (!SECTIONS.includes(s)) throw new Error(`--only: unknown section ${s} (${SECTIONS.join(", ")})`);

/** The warm stack's `[acp] keep_agent_alive_secs` in the follow-up cell: far longer than one turn. */
const FOLLOW_UP_KEEP_SECS = 300;

/** Sizes of everything; --quick keeps the whole suite under 3 minutes (on a quiet 2-core machine). */
const PLAN = quick
  ? {
      startRuns: 10,
      followUpRuns: 5,
      peerRuns: 3,
      burstReps: 1,
      bursts: [
        { count: 20_000, chunk: 32, kind: "message" },
        { count: 2_000, chunk: 32, kind: "tool" },
      ],
      wakeup: { intervalMs: 50, count: 40 },
      fanout: { ns: [1, 10], ms: [10, 100], intervalMs: 250, durationMs: 3000, warmupMs: 500, perPrincipal: 8 },
      clusterFanout: { n: 10, m: 100, intervalMs: 250, durationMs: 3000, warmupMs: 500, perPrincipal: 8 },
      links: { runners: 1000, connectConcurrency: 64, idleMs: 3000 },
      webhookRuns: 5,
      workspaces: { files: [1000, 2000], runs: 5, largeRuns: 2, changeFiles: 200, changeReps: 2 },
    }
  : {
      startRuns: 50,
      followUpRuns: 30,
      peerRuns: 10,
      burstReps: 3,
      bursts: [
        { count: 100_000, chunk: 32, kind: "message" },
        { count: 10_000, chunk: 32, kind: "tool" },
      ],
      wakeup: { intervalMs: 50, count: 200 },
      fanout: {
        ns: [1, 10, 50],
        ms: [10, 100, 500, 1000],
        intervalMs: 250,
        durationMs: 10_000,
        warmupMs: 1000,
        perPrincipal: 8,
      },
      clusterFanout: { n: 50, m: 1000, intervalMs: 250, durationMs: 10_000, warmupMs: 1000, perPrincipal: 8 },
      // idleMs: longer than the Servers' heartbeat interval (15 s), so it holds a round of pings and lease writes.
      links: { runners: 10_000, connectConcurrency: 64, idleMs: 20_000 },
      webhookRuns: 50,
      // files: [the target's size, the reported one]; the large repository's runs are fewer (each checks out 10,000 files).
      workspaces: { files: [1000, 10_000], runs: 30, largeRuns: 10, changeFiles: 1000, changeReps: 5 },
    };

/** --grid bounds: N simulated Runners, M observers (issue 45 asks for M=2,000 beside the 1,000 target). */
const GRID_MAX_N = 1000;
const GRID_MAX_M = 2000;
if (opts.grid) {
  const [ns, ms] = opts.grid.split(":").map((part) => part.split(",").map(Number));
  const bad = (v, max) => !Number.isInteger(v) || v < 1 || v > max;
  if (!ns?.length || !ms?.length || ns.some((v) => bad(v, GRID_MAX_N)) || ms.some((v) => bad(v, GRID_MAX_M))) {
    throw new Error(
      `--grid expects NS:MS, e.g. 10:500 or 1,10:10,100 (each N 1-${GRID_MAX_N}, each M 1-${GRID_MAX_M})`,
    );
  }
  PLAN.fanout = { ...PLAN.fanout, ns, ms };
}

/** A full run: every section at full size (what bench-results/history.jsonl compares across commits). */
const FULL_RUN = !quick && !opts.only && !opts.grid && !opts["sdk-observers"];

/** The MCP client of the fan-out load generator (observers.mjs). */
const OBSERVER_CLIENT = opts["sdk-observers"] ? "sdk" : "lean";
const OBSERVER_CLIENT_LABEL = OBSERVER_CLIENT === "sdk" ? "SDK Client" : "lean MCP client (node:http)";

const t0 = Date.now();
const WATCHDOG_MS = quick ? 240_000 : 40 * 60_000;
const ctx = {
  quick,
  /** A per-section time bound, tighter in --quick. */
  budgetMs: (ms) => (quick ? Math.min(ms, 60_000) : ms),
  log: (msg) => process.stderr.write(`[bench +${((Date.now() - t0) / 1000).toFixed(1)}s] ${msg}\n`),
};
const nodeArgs = {};
if (opts.profile) {
  const profDir = join(REPO, "bench-results/profiles");
  mkdirSync(profDir, { recursive: true });
  nodeArgs.server = ["--cpu-prof", `--cpu-prof-dir=${join(profDir, "server")}`];
  nodeArgs.runner = ["--cpu-prof", `--cpu-prof-dir=${join(profDir, "runner")}`];
}

const results = {
  started_at: new Date().toISOString(),
  quick,
  plan: PLAN,
  machine: machineInfo(),
  sections: {},
  errors: {},
  targets: [],
};

async function section(name, fn) {
  if (!only.has(name)) return;
  ctx.log(`${name}: start`);
  const started = Date.now();
  try {
    results.sections[name] = await fn();
  } catch (error) {
    results.errors[name] = String(error?.stack ?? error).slice(0, 2000);
    ctx.log(`${name}: ERROR ${String(error?.message ?? error).split("\n")[0]}`);
  }
  ctx.log(`${name}: done in ${((Date.now() - started) / 1000).toFixed(1)} s`);
}

function stackAvailable() {
  return (
    fakeAgentBuilt() &&
    existsSync(join(REPO, "packages/server/dist/main.js")) &&
    existsSync(join(REPO, "packages/runner/dist/main.js"))
  );
}

async function withStack(label, fn) {
  if (!stackAvailable()) throw new Error("server/runner not built (packages/*/dist/main.js missing)");
  const stack = await launchStack({ label, nodeArgs });
  try {
    return await fn(stack);
  } finally {
    await stack.stop();
  }
}

const watchdog = setTimeout(() => {
  results.errors.watchdog = `bench exceeded ${WATCHDOG_MS} ms; partial results`;
  void finish().finally(() => process.exit(1));
}, WATCHDOG_MS);
watchdog.unref();

try {
  if (!fakeAgentBuilt()) throw new Error("fake-acp-agent is not built; run `tsc -b` (npm run bench does)");

  await section("start", async () => {
    let r;
    let error = null;
    try {
      r = await withStack("start", (stack) => startDispatch.measure(ctx, { stack, runs: PLAN.startRuns }));
    } catch (e) {
      // No stack (not built, or it failed to start): the baseline alone.
      error = String(e?.message ?? e);
      r = await startDispatch.measure(ctx, { stack: null, runs: PLAN.startRuns });
    }
    const { baseline, ours } = r;
    let spawn_cost;
    try {
      spawn_cost = await startDispatch.spawnCost(ctx, { runs: PLAN.startRuns });
    } catch (e) {
      spawn_cost = { error: String(e?.message ?? e) };
    }
    return {
      spawn_cost,
      baseline: strip(baseline),
      ours: ours && ours.runs > 0 ? strip(ours) : null,
      error: r.error ?? error,
      p50_ratio: ratio(ours?.latency_ms.p50, baseline.latency_ms.p50),
      p95_ratio: ratio(ours?.latency_ms.p95, baseline.latency_ms.p95),
      p99_ratio: ratio(ours?.latency_ms.p99, baseline.latency_ms.p99),
    };
  });

  await section("engines", async () => {
    // A throwaway PostgreSQL (scripts/postgres.mjs), loaded only for this section.
    const { startPostgresCluster } = await import("../postgres.mjs");
    const cluster = await startPostgresCluster();
    try {
      const sqlite = await launchStack({ label: "engines-sqlite", nodeArgs });
      try {
        const postgres = await launchStack({
          label: "engines-postgres",
          nodeArgs,
          stateUrl: await cluster.createDatabase(),
        });
        try {
          const r = await startDispatch.measureEngines(ctx, { sqlite, postgres, runs: PLAN.startRuns });
          return {
            sqlite: strip(r.sqlite),
            postgres: strip(r.postgres),
            failure_count: r.failure_count,
            failures: r.failures,
            duplicate_dispatches: r.duplicate_dispatches,
            p50_ratio: ratio(r.postgres.latency_ms.p50, r.sqlite.latency_ms.p50),
            p95_ratio: ratio(r.postgres.latency_ms.p95, r.sqlite.latency_ms.p95),
          };
        } finally {
          await postgres.stop();
        }
      } finally {
        await sqlite.stop();
      }
    } finally {
      await cluster.close();
    }
  });

  await section("follow-up", async () => {
    // Two stacks: keep_agent_alive_secs 0 (cold) and FOLLOW_UP_KEEP_SECS (warm), chains alternating turn by turn.
    const cold = await launchStack({ label: "follow-up-cold", nodeArgs, keepAgentAliveSecs: 0 });
    try {
      const warm = await launchStack({ label: "follow-up-warm", nodeArgs, keepAgentAliveSecs: FOLLOW_UP_KEEP_SECS });
      try {
        const r = await startDispatch.measureFollowUp(ctx, { cold, warm, runs: PLAN.followUpRuns });
        return {
          cold: strip(r.cold),
          warm: strip(r.warm),
          warm_hits: r.warm_hits,
          failure_count: r.failure_count,
          failures: r.failures,
          duplicate_dispatches: r.duplicate_dispatches,
          p50_ratio: ratio(r.warm.latency_ms.p50, r.cold.latency_ms.p50),
          p95_ratio: ratio(r.warm.latency_ms.p95, r.cold.latency_ms.p95),
        };
      } finally {
        await warm.stop();
      }
    } finally {
      await cold.stop();
    }
  });

  await section("webhooks", () => webhooks.run(ctx, { runs: PLAN.webhookRuns, nodeArgs }));

  await section("workspaces", () => workspaces.run(ctx, { ...PLAN.workspaces, nodeArgs }));

  await section("throughput", async () => {
    const out = {};
    for (const spec of PLAN.bursts) {
      const key = `${spec.kind}_${spec.count}`;
      const bare = [];
      const ours = [];
      let error = null;
      try {
        // A fresh stack per burst kind; bare and ours alternate PLAN.burstReps times on it.
        await withStack(`burst-${spec.kind}`, async (stack) => {
          for (let i = 0; i < PLAN.burstReps; i++) {
            bare.push(await throughput.baseline(ctx, spec));
            ours.push(await throughput.stack(ctx, { stack, spec }));
          }
        });
      } catch (e) {
        error = String(e?.message ?? e);
      }
      if (bare.length === 0) bare.push(await throughput.baseline(ctx, spec));
      const b = medianRun(bare);
      const o = ours.length ? medianRun(ours) : null;
      if (o) {
        // The RSS target is about one burst on a fresh Runner/Server: the first repetition.
        // Later repetitions also hold the retained rings of earlier (terminal) runs.
        o.resources = ours[0].resources;
        o.resources_max_over_reps = maxResources(ours.map((r) => r.resources));
      }
      out[key] = {
        reps: ours.length,
        baseline: b,
        ours: o,
        error,
        ratio: ratio(o?.updates_per_s, b.updates_per_s),
        per_rep_updates_per_s: { bare: bare.map((r) => r.updates_per_s), ours: ours.map((r) => r.updates_per_s) },
      };
    }
    return out;
  });

  await section("wakeup", async () => {
    const baseline = await wakeup.baseline(ctx, PLAN.wakeup);
    let ours = null;
    let error = null;
    try {
      ours = await withStack("wakeup", (stack) => wakeup.stack(ctx, { stack, ...PLAN.wakeup }));
    } catch (e) {
      error = String(e?.message ?? e);
    }
    // Attribution: the same wake-up with the Server alone (one simulated Runner pushing
    // every interval_ms, one MCP observer) — no Runner process, no agent pipe.
    let server_only = null;
    try {
      const r = await fanout.run(ctx, {
        ns: [1],
        ms: [1],
        intervalMs: PLAN.wakeup.intervalMs,
        durationMs: PLAN.wakeup.intervalMs * PLAN.wakeup.count,
        warmupMs: 300,
        perPrincipal: 1,
        client: OBSERVER_CLIENT,
        nodeArgs,
      });
      server_only = r.cells[0] ?? null;
    } catch (e) {
      server_only = { error: String(e?.message ?? e) };
    }
    return { baseline, ours, error, server_only };
  });

  await section("cluster", async () => {
    // Two Server instances on one throwaway PostgreSQL, the Runner linked to the first. The same wake-up
    // measurement through the first (the event arrives where the observer waits) and through the second
    // (the start is forwarded to the first, and the observer is woken by LISTEN/NOTIFY), one after the other.
    const { startPostgresCluster } = await import("../postgres.mjs");
    const cluster = await startPostgresCluster();
    try {
      const stack = await launchStack({ label: "cluster", nodeArgs, stateUrl: await cluster.createDatabase() });
      try {
        const other = await stack.addInstance("b");
        const same = await wakeup.stack(ctx, { stack, ...PLAN.wakeup });
        // The tap agent numbers each run's ticks from 0 in one file: start the second run's record afresh.
        writeFileSync(stack.tapFile, "");
        const cross = await wakeup.stack(ctx, { stack: other, ...PLAN.wakeup });
        return {
          same_instance: same,
          cross_instance: cross,
          p50_ratio: ratio(cross.latency_ms.p50, same.latency_ms.p50),
        };
      } finally {
        await stack.stop();
      }
    } finally {
      await cluster.close();
    }
  });

  await section("fanout", async () => {
    if (!stackAvailable()) throw new Error("server not built (packages/server/dist/main.js missing)");
    ctx.log(`fanout: observers: ${OBSERVER_CLIENT_LABEL}`);
    // Capacity: 8 observers (one principal) calling observe(wait_secs=0) back to back on a
    // run that emits nothing — the Server's CPU per observe round trip and calls/s; then the same on the floor.
    const observeCost = async (floor) => {
      try {
        const c = await fanout.run(ctx, {
          ns: [1],
          ms: [8],
          intervalMs: 3_600_000,
          durationMs: quick ? 3000 : 6000,
          warmupMs: 0,
          perPrincipal: 8,
          waitSecs: 0,
          client: OBSERVER_CLIENT,
          nodeArgs,
          floor,
        });
        const cell = c.cells[0];
        return {
          calls: cell.calls,
          calls_per_s: cell.calls_per_s,
          server_cpu_ms_per_call: cell.server.cpu_ms / cell.calls,
          observers_cpu_share: cell.cpu_share.observers,
          server_cpu_share: cell.cpu_share.server,
        };
      } catch (e) {
        return { error: String(e?.message ?? e) };
      }
    };
    const observe_cost = await observeCost(false);
    const floor_observe_cost = await observeCost(true);
    const r = await fanout.run(ctx, { ...PLAN.fanout, client: OBSERVER_CLIENT, nodeArgs });
    // The floor (issue 45): the same grid on the bare long-poll server, right after ours.
    let floor = null;
    try {
      floor = await fanout.run(ctx, { ...PLAN.fanout, nodeArgs, floor: true });
    } catch (e) {
      floor = { error: String(e?.message ?? e) };
    }
    let own_server_cell = null;
    try {
      own_server_cell = await fanout.ownServerCell(
        ctx,
        { ...PLAN.fanout, client: OBSERVER_CLIENT, nodeArgs },
        TARGETS.fanout,
      );
    } catch (e) {
      own_server_cell = { error: String(e?.message ?? e) };
    }
    return {
      ...r,
      crossings_100ms: fanout.crossings(r.cells, TARGETS.fanout.p99_ms),
      holds_100ms: fanout.holds(r.cells, TARGETS.fanout.p99_ms),
      observe_cost,
      own_server_cell,
      floor: floor.error ? floor : { cells: floor.cells, observe_cost: floor_observe_cost },
      floor_ratios: floor.error ? null : fanout.floorRatios(r.cells, floor.cells),
      floor_observe_cost_ratio: ratio(observe_cost?.server_cpu_ms_per_call, floor_observe_cost?.server_cpu_ms_per_call),
    };
  });

  await section("cluster-fanout", () =>
    clusterFanout.run(ctx, { ...PLAN.clusterFanout, client: OBSERVER_CLIENT, nodeArgs }),
  );

  await section("links", () => links.run(ctx, { ...PLAN.links, nodeArgs }));

  await section("barrier", async () => {
    let mod;
    try {
      mod = await import(join(BENCH_DIR, "barrier.mjs"));
    } catch (e) {
      throw new Error(`scripts/bench/barrier.mjs not available: ${String(e?.message ?? e).split("\n")[0]}`);
    }
    return await mod.run({ quick });
  });

  // No stack: one server child serves the three dispatch paths (suites/dispatch.mjs).
  await section("dispatch", () =>
    dispatch.run({ quick, ...(opts.profile ? { profileDir: join(REPO, "bench-results/profiles/dispatch") } : {}) }),
  );

  await section("peer", async () => {
    let stack = null;
    let stackError = null;
    try {
      if (stackAvailable()) stack = await launchStack({ label: "peer", nodeArgs });
    } catch (e) {
      stackError = String(e?.message ?? e);
    }
    try {
      const r = await peer.measure(ctx, { runs: PLAN.peerRuns, stack });
      return stackError ? { ...r, full_stack_error: stackError } : r;
    } finally {
      await stack?.stop();
    }
  });
} catch (error) {
  results.errors.harness = String(error?.stack ?? error);
}

clearTimeout(watchdog);
await finish();
process.exit(results.errors.harness ? 1 : 0);

/** The run with the median updates/s (lower middle for an even count). */
function medianRun(runs) {
  const sorted = [...runs].sort((a, b) => a.updates_per_s - b.updates_per_s);
  return { ...sorted[Math.floor((sorted.length - 1) / 2)] };
}

/** Per process: the largest peak RSS / HWM and CPU over the repetitions. */
function maxResources(list) {
  const out = {};
  for (const res of list) {
    for (const [name, r] of Object.entries(res ?? {})) {
      const m = out[name] ?? { peak_rss_mb: 0, hwm_mb: 0, cpu_ms: 0 };
      out[name] = {
        peak_rss_mb: Math.max(m.peak_rss_mb, r.peak_rss_mb),
        hwm_mb: Math.max(m.hwm_mb, r.hwm_mb),
        cpu_ms: Math.max(m.cpu_ms, r.cpu_ms),
      };
    }
  }
  return out;
}

function strip(r) {
  const { samples_ms, ...rest } = r;
  return { ...rest, samples_ms: samples_ms.map((v) => Math.round(v * 100) / 100) };
}

async function finish() {
  results.finished_at = new Date().toISOString();
  results.duration_s = (Date.now() - t0) / 1000;
  results.machine.loadavg_at_end = loadavg();
  results.targets = evaluateTargets(results);
  const outDir = dirname(opts.out);
  try {
    mkdirSync(outDir, { recursive: true });
    writeFileSync(opts.out, `${JSON.stringify(round(results), null, 2)}\n`);
  } catch (error) {
    process.stderr.write(`could not write ${opts.out}: ${error}\n`);
  }
  const png = join(outDir, `${basename(opts.out, ".json")}.png`);
  try {
    const why = await writePicture(results, png);
    if (why) process.stderr.write(`no picture: ${why}\n`);
  } catch (error) {
    process.stderr.write(`could not write ${png}: ${error}\n`);
  }
  if (FULL_RUN) {
    try {
      appendFileSync(join(outDir, "history.jsonl"), `${JSON.stringify(historyLine(results))}\n`);
    } catch (error) {
      process.stderr.write(`could not append to history.jsonl: ${error}\n`);
    }
  }
  process.stdout.write(render(results));
  removeTempDirs({ keep: opts.keep });
}
