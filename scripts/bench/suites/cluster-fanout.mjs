/**
 * The fan-out (suites/fanout.mjs) across two Server instances on one PostgreSQL: N simulated Runners
 * linked to instance A, M observers long-polling, in two cells one after the other —
 *
 * - `split`: observers alternate between A and B (half of them wait where the events arrive, half on the
 *   instance that learns of them through the database's notification and fetches them through A);
 * - `all_on_b`: every observer on B.
 *
 * The baseline is the same N × M cell on one Server with its state on SQLite, measured first in the same
 * run (a Server of its own, as the fan-out section's memory cell). Runs are started through A. Last, the
 * `split` cell again on two fresh instances that serve each other's requests on a listener of their own
 * (`[server.cluster] listen_port`), so that a peer's new connection does not queue behind the observers'.
 */
import { stopTracked } from "../lib/proc.mjs";
import { startSims } from "../lib/sims.mjs";
import { ratio } from "../lib/stats.mjs";
import { launchStack } from "../stack.mjs";
import * as fanout from "./fanout.mjs";

/** @param {{ n: number, m: number, intervalMs: number, durationMs: number, warmupMs: number, perPrincipal: number, client: string, nodeArgs: object }} plan */
export async function run(ctx, plan) {
  const { n, m, intervalMs, durationMs, warmupMs, perPrincipal, client, nodeArgs } = plan;
  const cellPlan = { n, first: 0, m, durationMs, warmupMs, perPrincipal, client };

  ctx.log(`cluster-fanout: baseline, one Server on SQLite, N=${n} M=${m}`);
  const single = await fanout.run(ctx, {
    ns: [n],
    ms: [m],
    intervalMs,
    durationMs,
    warmupMs,
    perPrincipal,
    client,
    nodeArgs,
  });
  const baseline = single.cells[0];

  const { startPostgresCluster } = await import("../../postgres.mjs");
  const cluster = await startPostgresCluster();
  /** Two instances (A with the sims' links, B), the sims started; `cells(stack, sims, a, b)` measures. */
  const onTwo = async (label, clusterListener, cells) => {
    const stack = await launchStack({
      label,
      nodeArgs,
      runner: false,
      simRunners: n,
      principals: Math.ceil(m / perPrincipal),
      stateUrl: await cluster.createDatabase(),
      clusterListener,
    });
    try {
      const other = await stack.addInstance("b");
      const sims = await startSims(stack, {
        name: label,
        runners: stack.sims,
        intervalMs,
        maxDurationMs: ctx.budgetMs(30 * 60_000),
        nodeArgs,
      });
      try {
        return await cells(stack, sims, { name: "a", url: stack.url }, { name: "b", url: other.url });
      } finally {
        await stopTracked(sims, 2000);
      }
    } finally {
      await stack.stop();
    }
  };
  try {
    const { split, allOnB } = await onTwo("cluster-fanout", false, async (stack, sims, a, b) => {
      ctx.log(`cluster-fanout: two instances on PostgreSQL, observers split A/B, N=${n} M=${m}`);
      const split = await fanout.cell(stack, sims.pid, nodeArgs, { ...cellPlan, instances: [a, b] });
      ctx.log(`cluster-fanout: two instances on PostgreSQL, every observer on B, N=${n} M=${m}`);
      const allOnB = await fanout.cell(stack, sims.pid, nodeArgs, { ...cellPlan, instances: [b] });
      return { split, allOnB };
    });
    const splitOwnListener = await onTwo("cluster-fanout-own", true, async (stack, sims, a, b) => {
      ctx.log(`cluster-fanout: observers split A/B, /_wc/ on a listener of its own, N=${n} M=${m}`);
      return await fanout.cell(stack, sims.pid, nodeArgs, { ...cellPlan, instances: [a, b] });
    });
    return {
      n,
      m,
      client,
      interval_ms: intervalMs,
      duration_ms: durationMs,
      baseline_sqlite: baseline,
      split,
      all_on_b: allOnB,
      split_own_listener: splitOwnListener,
      ratios: {
        split_a_p50: ratio(split.by_group?.a?.p50, baseline.latency_ms.p50),
        split_a_p99: ratio(split.by_group?.a?.p99, baseline.latency_ms.p99),
        split_b_p50: ratio(split.by_group?.b?.p50, baseline.latency_ms.p50),
        split_b_p99: ratio(split.by_group?.b?.p99, baseline.latency_ms.p99),
        all_on_b_p50: ratio(allOnB.latency_ms.p50, baseline.latency_ms.p50),
        all_on_b_p99: ratio(allOnB.latency_ms.p99, baseline.latency_ms.p99),
        split_own_listener_b_p99: ratio(splitOwnListener.by_group?.b?.p99, baseline.latency_ms.p99),
        // Issue 45 §4: the worse instance of the split cell, and what both serve together.
        split_p99: ratio(worse(split.by_group?.a?.p99, split.by_group?.b?.p99), baseline.latency_ms.p99),
        split_calls_per_s: ratio(split.calls_per_s, baseline.calls_per_s),
      },
    };
  } finally {
    await cluster.close();
  }
}

/** The larger of two p99s; undefined when either is missing (a group that got no answer is not "better"). */
function worse(a, b) {
  return typeof a === "number" && typeof b === "number" ? Math.max(a, b) : undefined;
}
