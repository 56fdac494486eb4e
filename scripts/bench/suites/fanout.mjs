/**
 * Fan-out: 1 Server, N simulated Runners (sim-runners.mjs, real protocol over
 * real WebSocket), M concurrent MCP observers (observers.mjs) long-polling.
 * Each observer's principal owns the run it watches (observe needs ownership),
 * and the Server bounds waiting observes per principal, so observers are
 * spread over ceil(M / perPrincipal) principals. Runs = max(N, principals),
 * run j on runner j mod N owned by principal j mod P; every run pushes one
 * event every interval_ms. `client` picks the observers' MCP client: "lean"
 * (lib/mcp-lean.mjs, plain node:http) or "sdk" (the SDK Client). `floor`: the same cells on the bare
 * long-poll server (floor-server.mjs) instead of a Server; the observers then always use the lean client.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { launchFloor } from "../floor-stack.mjs";
import { spawnJsonChild } from "../lib/child.mjs";
import { BENCH_DIR } from "../lib/paths.mjs";
import { ProcSampler, stopTracked } from "../lib/proc.mjs";
import { profileArgs, startSims } from "../lib/sims.mjs";
import { ratio } from "../lib/stats.mjs";
import { launchStack } from "../stack.mjs";

export async function run(
  ctx,
  { ns, ms, intervalMs, durationMs, warmupMs, perPrincipal, waitSecs = 10, client = "lean", nodeArgs, floor = false },
) {
  const maxM = Math.max(...ms);
  if (floor) client = "lean";
  // Each N gets runner ids of its own: the Server refuses a second link for a runner id whose previous
  // link is not yet declared dead (link_in_use), and the previous N's sim process has just been killed.
  const offsets = ns.map((_, i) => ns.slice(0, i).reduce((a, b) => a + b, 0));
  const sized = {
    nodeArgs,
    simRunners: ns.reduce((a, b) => a + b, 0),
    principals: Math.ceil(maxM / perPrincipal),
  };
  const stack = floor
    ? await launchFloor({ label: "fanout-floor", ...sized })
    : await launchStack({ label: "fanout", runner: false, ...sized });
  const cells = [];
  try {
    for (const [index, n] of ns.entries()) {
      const first = offsets[index];
      const sims = await startSims(stack, {
        name: `${index}-${n}`,
        runners: stack.sims.slice(first, first + n),
        intervalMs,
        maxDurationMs: ctx.budgetMs(30 * 60_000),
        nodeArgs,
      });
      try {
        for (const m of ms) {
          ctx.log(`fan-out N=${n} M=${m} (${client} observers${floor ? ", floor" : ""})`);
          cells.push(
            await cell(stack, sims.pid, nodeArgs, {
              n,
              first,
              m,
              durationMs,
              warmupMs,
              perPrincipal,
              waitSecs,
              client,
            }),
          );
        }
      } finally {
        await stopTracked(sims, 2000);
      }
    }
  } finally {
    await stack.stop();
  }
  return {
    client,
    floor,
    interval_ms: intervalMs,
    duration_ms: durationMs,
    warmup_ms: warmupMs,
    per_principal: perPrincipal,
    cells,
  };
}

/**
 * One cell: `m` observers on the runs of sim runners `first..first+n-1` (already linked), for `durationMs`.
 * `instances` ({ name, url }[], default: the stack's own MCP URL as "server") spreads the observers over
 * Server instances round-robin; the result then also has `by_group`: the latency of each instance's observers, by name.
 * Runs are started through the stack's first instance.
 */
export async function cell(
  stack,
  simsPid,
  nodeArgs,
  { n, first, m, durationMs, warmupMs, perPrincipal, waitSecs = 10, client = "lean", instances },
) {
  const principals = Math.ceil(m / perPrincipal);
  const runCount = Math.max(n, principals);
  const clients = [];
  for (let p = 0; p < principals; p++) clients.push(await stack.mcpClient(p));
  const runsByPrincipal = Array.from({ length: principals }, () => []);
  const allRuns = [];
  try {
    for (let j = 0; j < runCount; j++) {
      const p = j % principals;
      const r = await clients[p].start({
        project_id: `p${first + (j % n)}`,
        provider_id: "sim",
        prompt: `fan-out run ${j} (N=${n}, M=${m})`,
      });
      if (!r.ok) throw new Error(`start_coding_agent (fan-out) failed: ${JSON.stringify(r.error)}`);
      runsByPrincipal[p].push(r.value.run_id);
      allRuns.push({ p, run_id: r.value.run_id });
    }
    const observers = [];
    for (let i = 0; i < m; i++) {
      const p = Math.floor(i / perPrincipal);
      const own = runsByPrincipal[p];
      const at = instances?.[i % instances.length];
      observers.push({
        token: stack.tokens[p],
        run_id: own[(i % perPrincipal) % own.length],
        ...(at ? { url: at.url, group: at.name } : {}),
      });
    }
    const specFile = join(stack.dir, `observers-${n}-${m}.json`);
    writeFileSync(
      specFile,
      JSON.stringify({
        url: stack.url,
        wait_secs: waitSecs,
        duration_ms: durationMs,
        warmup_ms: warmupMs,
        client,
        observers,
      }),
    );
    const obs = spawnJsonChild(join(BENCH_DIR, "observers.mjs"), [specFile], {
      logFile: join(stack.dir, `observers-${n}-${m}.log`),
      nodeArgs: profileArgs(nodeArgs, "observers"),
    });
    const sampler = new ProcSampler({ ...stack.pids(), observers: obs.pid, sim_runners: simsPid }, 100).start();
    const sampledFrom = Date.now();
    let result;
    try {
      result = await obs.waitLine((l) => "latency_ms" in l, durationMs + m * 5 + (waitSecs + 30) * 1000);
    } finally {
      await stopTracked(obs, 1000);
    }
    const resources = sampler.stop();
    const wallMs = Date.now() - sampledFrom;
    return {
      n,
      m,
      principals,
      runs: runCount,
      ...result,
      server: resources.server,
      // Every sampled process (a second Server instance as server_b), peak RSS and CPU.
      processes: resources,
      calls_per_s: result.calls / (wallMs / 1000),
      // CPU share of each process over the cell: near 1.0 means that process was the bottleneck.
      cpu_share: Object.fromEntries(Object.entries(resources).map(([k, r]) => [k, r.cpu_ms / wallMs])),
    };
  } finally {
    for (const { p, run_id } of allRuns) await clients[p].cancel(run_id).catch(() => {});
    for (const c of clients) await c.close().catch(() => {});
  }
}

/**
 * The memory target's cell (N=target.n × M=target.m) again, on a Server of its own: in the grid that
 * cell's Server has also served every earlier cell (their runs' mirrors and cached records stay), so its
 * RSS there is the grid's history, not the cell's. Measured only when the grid holds that cell and other
 * cells before it (with `--grid 50:1000` the grid's one cell is already on a fresh Server). Returns the
 * cell, or null when not measured.
 */
export async function ownServerCell(ctx, plan, target) {
  const inGrid = plan.ns.includes(target.n) && plan.ms.includes(target.m);
  if (!inGrid || plan.ns.length * plan.ms.length === 1) return null;
  ctx.log(`fan-out N=${target.n} M=${target.m} again, on a Server of its own (memory target)`);
  const r = await run(ctx, { ...plan, ns: [target.n], ms: [target.m] });
  return r.cells[0] ?? null;
}

/** For each N: the smallest M whose p99 exceeds `limitMs` (null when none did). */
export function crossings(cells, limitMs) {
  const out = {};
  for (const c of cells) {
    const key = `N=${c.n}`;
    if (!(key in out)) out[key] = null;
    if (out[key] === null && c.latency_ms?.p99 > limitMs) out[key] = c.m;
  }
  return out;
}

/** For each N: the largest M tried whose p99 and every smaller M's p99 stayed ≤ `limitMs` (null when none). */
export function holds(cells, limitMs) {
  const out = {};
  for (const n of [...new Set(cells.map((c) => c.n))]) {
    let best = null;
    for (const c of cells.filter((cc) => cc.n === n).sort((a, b) => a.m - b.m)) {
      if (!(c.latency_ms?.p99 <= limitMs)) break;
      best = c.m;
    }
    out[`N=${n}`] = best;
  }
  return out;
}

/**
 * Each cell of `ours` against the same cell of `floor` (the bare long-poll server, same run): p50 / p99
 * latency, observe calls/s served and Server CPU per answered observe, as ours ÷ floor.
 */
export function floorRatios(ours, floor) {
  const out = [];
  for (const c of ours) {
    const f = floor.find((ff) => ff.n === c.n && ff.m === c.m);
    if (!f) continue;
    out.push({
      n: c.n,
      m: c.m,
      p50: ratio(c.latency_ms?.p50, f.latency_ms?.p50),
      p99: ratio(c.latency_ms?.p99, f.latency_ms?.p99),
      calls_per_s: ratio(c.calls_per_s, f.calls_per_s),
      server_cpu_ms_per_call: ratio(cpuPerCall(c), cpuPerCall(f)),
      answer_bytes_p50: ratio(c.answer_bytes?.p50, f.answer_bytes?.p50),
    });
  }
  return out;
}

/** Server CPU per observe call answered in a cell (ms). */
export function cpuPerCall(c) {
  return c.server && c.calls > 0 ? c.server.cpu_ms / c.calls : null;
}
