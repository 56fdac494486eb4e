/**
 * Many idle Runner links held by the Server: `runners` simulated Runners (sim-runners.mjs, one process, a
 * real WebSocket and a real hello each) declared in the Server config as `[[runners]]` with their token's
 * sha256 (as every Runner is provisioned), linked to one Server (SQLite or PostgreSQL) or spread over two
 * instances on one PostgreSQL (runner i to instance i mod 2).
 *
 * Measured: the hello rate (links acknowledged per second, at most `connectConcurrency` hellos in flight),
 * each instance's RSS and open file descriptors before the first hello and after the last (settled), so
 * memory and fds per idle link; the instances' CPU while linking and while idle over `idleMs` (at least a
 * heartbeat interval: pings and the lease write-down), and how many links were still open at the end.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { openFds, ProcSampler, readProc, stopTracked } from "../lib/proc.mjs";
import { startSims } from "../lib/sims.mjs";
import { launchStack } from "../stack.mjs";

/** Sockets per instance: every link plus control clients, below the 20,000 open-file limit of the bench. */
export const LINKS_MAX_CONNECTIONS = 12_000;
/** Time for an instance's memory to settle after start and after the last hello, before it is read. */
export const LINKS_SETTLE_MS = 3000;
/** Per runner, how long the hellos may take in all (plus LINKS_READY_BASE_MS) before the suite gives up. */
const LINKS_READY_PER_RUNNER_MS = 20;
const LINKS_READY_BASE_MS = 60_000;
/** Nothing is started on these links: no run, so no event interval. */
const NO_RUNS_INTERVAL_MS = 3_600_000;

function snapshot(pids) {
  const out = {};
  for (const [name, pid] of Object.entries(pids)) {
    const p = readProc(pid);
    out[name] = { rss_mb: p ? p.rssKb / 1024 : null, cpu_ms: p?.cpuMs ?? null, fds: openFds(pid) };
  }
  return out;
}

/**
 * @param {object} o
 * @param {number} o.runners simulated Runners (links)
 * @param {1|2} o.instances Server instances (2 needs `stateUrl`)
 * @param {string} [o.stateUrl] PostgreSQL database of the Servers' state (absent: SQLite)
 * @param {number} o.connectConcurrency hellos in flight at most
 * @param {number} o.idleMs idle window after the last hello
 */
export async function measure(ctx, { runners, instances, stateUrl, connectConcurrency, idleMs, nodeArgs }) {
  const engine = stateUrl === undefined ? "sqlite" : "postgres";
  const label = `links-${engine}-${instances}`;
  ctx.log(`links: ${runners} runners, ${instances} instance(s) on ${engine}: provisioning`);
  const stack = await launchStack({
    label,
    nodeArgs,
    runner: false,
    simRunners: runners,
    principals: 1,
    principalProjects: ["p0"],
    maxConnections: LINKS_MAX_CONNECTIONS,
    stateUrl,
  });
  try {
    const targets = [{ name: "server", runnerUrl: stack.runnerUrl }];
    if (instances === 2) {
      const other = await stack.addInstance("b");
      targets.push({ name: "server_b", runnerUrl: other.runnerUrl });
    }
    await sleep(LINKS_SETTLE_MS);
    const pids = Object.fromEntries(targets.map((t) => [t.name, stack.pids()[t.name]]));
    const before = snapshot(pids);
    const defs = stack.sims.map((sim, i) => ({ ...sim, url: targets[i % targets.length].runnerUrl }));
    ctx.log(`links: ${runners} hellos, at most ${connectConcurrency} in flight`);
    const sims = await startSims(stack, {
      name: label,
      runners: defs,
      intervalMs: NO_RUNS_INTERVAL_MS,
      maxDurationMs: ctx.budgetMs(30 * 60_000),
      connectConcurrency,
      nodeArgs,
      readyTimeoutMs: LINKS_READY_BASE_MS + runners * LINKS_READY_PER_RUNNER_MS,
    });
    let idle;
    let linked;
    let after;
    try {
      linked = snapshot(pids);
      await sleep(LINKS_SETTLE_MS);
      after = snapshot(pids);
      ctx.log(`links: idle for ${idleMs} ms`);
      const sampler = new ProcSampler({ ...pids, sim_runners: sims.pid }, 250).start();
      const from = Date.now();
      await sleep(idleMs);
      idle = { resources: sampler.stop(), wall_ms: Date.now() - from };
    } finally {
      await stopTracked(sims, 5000);
    }
    const stopped = sims.lines.find((l) => "stopped" in l);
    const perInstance = {};
    for (const [i, t] of targets.entries()) {
      const links = defs.filter((_, j) => j % targets.length === i).length;
      const b = before[t.name];
      const a = after[t.name];
      perInstance[t.name] = {
        links,
        rss_before_mb: b.rss_mb,
        rss_after_mb: a.rss_mb,
        kb_per_link: ((a.rss_mb - b.rss_mb) * 1024) / links,
        fds_before: b.fds,
        fds_after: a.fds,
        fds_per_link: (a.fds - b.fds) / links,
        hello_cpu_ms: linked[t.name].cpu_ms - b.cpu_ms,
        hello_cpu_ms_per_link: (linked[t.name].cpu_ms - b.cpu_ms) / links,
        idle_cpu_share: idle.resources[t.name]?.cpu_ms / idle.wall_ms,
        idle_peak_rss_mb: idle.resources[t.name]?.peak_rss_mb,
      };
    }
    return {
      engine,
      instances,
      runners,
      connect_concurrency: connectConcurrency,
      hello: {
        acked_per_s: sims.ready.acked_per_s,
        elapsed_ms: sims.ready.elapsed_ms,
        hello_ms: sims.ready.hello_ms,
      },
      per_instance: perInstance,
      idle_ms: idle.wall_ms,
      sim_runners: { rss_mb: sims.ready.rss_mb, idle_cpu_share: idle.resources.sim_runners?.cpu_ms / idle.wall_ms },
      open_at_stop: stopped?.open_at_stop ?? null,
    };
  } finally {
    await stack.stop();
  }
}

/** The links section: one SQLite Server, then two instances on one PostgreSQL, each with `runners` links. */
export async function run(ctx, { runners, connectConcurrency, idleMs, nodeArgs }) {
  const out = {};
  try {
    out.sqlite_one = await measure(ctx, { runners, instances: 1, connectConcurrency, idleMs, nodeArgs });
  } catch (error) {
    out.sqlite_one = { error: String(error?.stack ?? error).slice(0, 2000) };
  }
  const { startPostgresCluster } = await import("../../postgres.mjs");
  const cluster = await startPostgresCluster();
  try {
    out.postgres_two = await measure(ctx, {
      runners,
      instances: 2,
      stateUrl: await cluster.createDatabase(),
      connectConcurrency,
      idleMs,
      nodeArgs,
    });
  } catch (error) {
    out.postgres_two = { error: String(error?.stack ?? error).slice(0, 2000) };
  } finally {
    await cluster.close();
  }
  return out;
}
