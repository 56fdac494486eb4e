/**
 * Issue 16 §5 (full suite only): 1,000 sequential runs, then 200 cycles of
 * `max_concurrent_runs` runs at once, through a real Server child and Runner
 * child. Every SAMPLE_EVERY runs: RSS and open fds of both daemons, SQLite file
 * sizes (database and WAL) of both state dirs, and the Runner's live child
 * count. Written to bench-results/soak.json and drawn to bench-results/soak.png,
 * then asserted flat within the tolerances below.
 */
import { mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ObserveOutput } from "../../../packages/server/src/runs/api.js";
import { okValue, ProcStack } from "../../../packages/server/test/support/proc-stack.js";
import { poll, REPO_ROOT } from "../../test-support/index.js";
import { soakSvg, svgToPng } from "./support/chart.js";
import { fdCount, rssBytes } from "./support/profile.js";

const SEQUENTIAL_RUNS = Number(process.env.WEBCODEX_SOAK_RUNS ?? 1000);
const CAPACITY_CYCLES = Number(process.env.WEBCODEX_SOAK_CYCLES ?? 200);
const CONCURRENT = 4; // ProcStack's max_concurrent_runs
const SAMPLE_EVERY = 20;
/** Bound on every agent process of the Runner being gone (before each full-capacity cycle, and at the end). */
const CAPACITY_WAIT_MS = 20_000;
/**
 * Poll interval of the waits on the Runner's cleanup (the next cycle's free slots). Cleanup ends some 10–30 ms
 * after a run's terminal answer; a coarse poll would add most of an interval to each of the 200 cycles.
 */
const CLEANUP_POLL_MS = 10;
/** Tolerances: RSS of the last quarter of samples vs the second quarter (after warm-up). */
const RSS_TOLERANCE_RATIO = 1.3;
const RSS_TOLERANCE_BYTES = 32 * 1024 * 1024;
/** Open descriptors may differ from the warmed-up count by this much (SQLite, sockets in TIME_WAIT handling). */
const FD_TOLERANCE = 8;
/** Every run adds one durable row on each side; more than this per run would be unbounded growth. */
const DB_BYTES_PER_RUN = 16 * 1024;
const WAL_MAX_BYTES = 64 * 1024 * 1024;

interface Sample {
  phase: "sequential" | "capacity";
  run: number;
  at_ms: number;
  server_rss: number;
  runner_rss: number;
  server_fds: number;
  runner_fds: number;
  server_db: number;
  server_wal: number;
  runner_db: number;
  runner_wal: number;
  runner_children: number;
}

function sizes(dir: string): { db: number; wal: number } {
  let db = 0;
  let wal = 0;
  for (const name of readdirSync(dir)) {
    const size = statSync(join(dir, name), { throwIfNoEntry: false })?.size ?? 0;
    if (name.endsWith("-wal")) wal += size;
    else if (/\.(sqlite3?|db)$/.test(name)) db += size;
  }
  return { db, wal };
}

/** Resolves once the Runner has no live child, polling every CLEANUP_POLL_MS; throws after `timeoutMs`. */
async function noChildren(pid: number, what: string, timeoutMs: number): Promise<void> {
  await poll(() => childCount(pid) === 0, { timeoutMs, intervalMs: CLEANUP_POLL_MS, what });
}

function childCount(pid: number): number {
  let n = 0;
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (fields[0] !== "Z" && Number(fields[1]) === pid) n++;
    } catch {}
  }
  return n;
}

describe("soak: sequential runs and full-capacity cycles", () => {
  let stack: ProcStack;
  beforeAll(async () => {
    stack = await new ProcStack({ server: "child", runners: [{ id: "r1", projects: ["p1"] }] }).init();
    await stack.startRunner("r1");
  });
  afterAll(async () => {
    await stack?.stop();
  });

  async function runToEnd(key: string): Promise<void> {
    // Never `capacity`: a run that has ended keeps its slot until its agent is gone, and a start then waits for
    // that (the Runner's SETTLE_WAIT_MS) instead of being refused for a run its caller was told has ended.
    const input = { project_id: "p1", provider_id: "fake", idempotency_key: key, prompt: "scenario: hello" };
    const started = okValue(await stack.start("alice", input));
    let token: string | undefined = started.observation_token;
    for (let i = 0; i < 60; i++) {
      const o: ObserveOutput = okValue(
        await stack.observe("alice", {
          run_id: started.run_id,
          wait_secs: 5,
          ...(token ? { after_observation_token: token } : {}),
        }),
      );
      if (["completed", "failed", "cancelled", "lost"].includes(o.state)) {
        expect(o.state, `soak run ${key}`).toBe("completed");
        return;
      }
      token = o.observation_token;
    }
    throw new Error(`soak run ${key} did not end`);
  }

  it(
    `stays flat over ${SEQUENTIAL_RUNS} sequential runs and ${CAPACITY_CYCLES} full-capacity cycles`,
    async () => {
      const t0 = Date.now();
      const serverPid = stack.serverChild!.pid!;
      const runnerPid = stack.runnerProcs.get("r1")!.pid!;
      const samples: Sample[] = [];
      const sample = async (phase: Sample["phase"], run: number) => {
        const s = sizes(join(stack.dir, "server-state"));
        const r = sizes(join(stack.dir, "runner-state-r1"));
        samples.push({
          phase,
          run,
          at_ms: Date.now() - t0,
          server_rss: (await rssBytes(serverPid))!,
          runner_rss: (await rssBytes(runnerPid))!,
          server_fds: (await fdCount(serverPid))!,
          runner_fds: (await fdCount(runnerPid))!,
          server_db: s.db,
          server_wal: s.wal,
          runner_db: r.db,
          runner_wal: r.wal,
          runner_children: childCount(runnerPid),
        });
      };
      let run = 0;
      await sample("sequential", run);
      for (let i = 0; i < SEQUENTIAL_RUNS; i++) {
        await runToEnd(`soak-seq-${i}`);
        run++;
        if (run % SAMPLE_EVERY === 0) await sample("sequential", run);
      }
      const sequentialSecs = (Date.now() - t0) / 1000;
      for (let c = 0; c < CAPACITY_CYCLES; c++) {
        // Wait for the previous cycle's slots (cleanup ends a moment after the last process exits).
        await noChildren(runnerPid, "free capacity", CAPACITY_WAIT_MS);
        await Promise.all(Array.from({ length: CONCURRENT }, (_, k) => runToEnd(`soak-cap-${c}-${k}`)));
        run += CONCURRENT;
        if (c % Math.max(1, Math.floor(SAMPLE_EVERY / CONCURRENT)) === 0) await sample("capacity", run);
      }
      await noChildren(runnerPid, "no agent left", CAPACITY_WAIT_MS);
      await sample("capacity", run);
      const totalSecs = (Date.now() - t0) / 1000;

      const out = join(REPO_ROOT, "bench-results");
      mkdirSync(out, { recursive: true });
      const report = {
        sequential_runs: SEQUENTIAL_RUNS,
        capacity_cycles: CAPACITY_CYCLES,
        concurrent: CONCURRENT,
        sequential_secs: sequentialSecs,
        total_secs: totalSecs,
        tolerances: {
          rss_ratio: RSS_TOLERANCE_RATIO,
          rss_bytes: RSS_TOLERANCE_BYTES,
          fds: FD_TOLERANCE,
          db_bytes_per_run: DB_BYTES_PER_RUN,
          wal_max_bytes: WAL_MAX_BYTES,
        },
        samples,
      };
      writeFileSync(join(out, "soak.json"), `${JSON.stringify(report, null, 2)}\n`);
      const mib = (b: number) => b / 2 ** 20;
      const series = (label: string, unit: string, f: (s: Sample) => number) => ({
        label,
        unit,
        points: samples.map((s) => [s.run, f(s)] as [number, number]),
      });
      const svg = soakSvg(
        `WebCodex soak: ${SEQUENTIAL_RUNS} sequential runs, then ${CAPACITY_CYCLES} × ${CONCURRENT} at once`,
        [
          [
            series("Server RSS", "MiB", (s) => mib(s.server_rss)),
            series("Runner RSS", "MiB", (s) => mib(s.runner_rss)),
          ],
          [series("Server fds", "count", (s) => s.server_fds), series("Runner fds", "count", (s) => s.runner_fds)],
          [
            series("Server DB", "MiB", (s) => mib(s.server_db)),
            series("Server WAL", "MiB", (s) => mib(s.server_wal)),
            series("Runner DB", "MiB", (s) => mib(s.runner_db)),
            series("Runner WAL", "MiB", (s) => mib(s.runner_wal)),
          ],
          [series("Runner children", "count", (s) => s.runner_children)],
        ],
      );
      writeFileSync(join(out, "soak.svg"), svg);
      await svgToPng(svg, join(out, "soak.png"));
      console.log(
        `soak: ${run} runs in ${totalSecs.toFixed(0)} s (sequential ${sequentialSecs.toFixed(0)} s); bench-results/soak.json, soak.png`,
      );

      // Flat within tolerance.
      const q = Math.floor(samples.length / 4);
      const second = samples.slice(q, 2 * q);
      const last = samples.slice(3 * q);
      for (const key of ["server_rss", "runner_rss"] as const) {
        const ref = Math.max(...second.map((s) => s[key]));
        const end = Math.max(...last.map((s) => s[key]));
        expect(end, `${key}: ${mib(ref).toFixed(0)} → ${mib(end).toFixed(0)} MiB`).toBeLessThanOrEqual(
          ref * RSS_TOLERANCE_RATIO + RSS_TOLERANCE_BYTES,
        );
      }
      const warm = samples[Math.min(1, samples.length - 1)]!;
      const final = samples.at(-1)!;
      expect(final.server_fds, "server fds").toBeLessThanOrEqual(warm.server_fds + FD_TOLERANCE);
      expect(final.runner_fds, "runner fds").toBeLessThanOrEqual(warm.runner_fds + FD_TOLERANCE);
      expect(final.runner_children).toBe(0);
      for (const s of samples) {
        expect(s.server_wal).toBeLessThanOrEqual(WAL_MAX_BYTES);
        expect(s.runner_wal).toBeLessThanOrEqual(WAL_MAX_BYTES);
      }
      const first = samples[0]!;
      expect((final.server_db - first.server_db) / run, "server DB bytes per run").toBeLessThanOrEqual(
        DB_BYTES_PER_RUN,
      );
      expect((final.runner_db - first.runner_db) / run, "runner DB bytes per run").toBeLessThanOrEqual(
        DB_BYTES_PER_RUN,
      );
    },
    20 * 60_000,
  );
});
