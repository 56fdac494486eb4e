/** One line of bench-results/history.jsonl per full run: enough to see a regression across commits. */
import { round } from "./stats.mjs";

export function historyLine(results) {
  const s = results.sections;
  const m = results.machine;
  const fan = s.fanout;
  return round({
    started_at: results.started_at,
    duration_s: results.duration_s,
    commit: m.git_commit,
    machine: {
      cpu_model: m.cpu_model,
      cores: m.cores,
      node: m.node,
      loadavg_at_start: m.loadavg_at_start,
      loadavg_at_end: m.loadavg_at_end,
    },
    targets: Object.fromEntries(results.targets.map((t) => [t.id, { value: t.value, result: t.result }])),
    fanout_p99_ms: fan ? Object.fromEntries(fan.cells.map((c) => [`${c.n}x${c.m}`, c.latency_ms?.p99 ?? null])) : null,
    fanout_holds_100ms: fan?.holds_100ms ?? null,
    observe_server_cpu_ms_per_call: fan?.observe_cost?.server_cpu_ms_per_call ?? null,
    webhook_terminal_delivery_ms: s.webhooks?.delivery_ms?.terminal
      ? { p50: s.webhooks.delivery_ms.terminal.p50, p99: s.webhooks.delivery_ms.terminal.p99 }
      : null,
    worktree_large_p50_ratio: s.workspaces?.large_p50_ratio ?? null,
    changes_all_pages_p50_ms: s.workspaces?.changes?.ours_all_pages_ms?.p50 ?? null,
    peer: s.peer?.ratios ?? (s.peer?.skipped ? { skipped: s.peer.skipped } : null),
    errors: Object.keys(results.errors),
  });
}
