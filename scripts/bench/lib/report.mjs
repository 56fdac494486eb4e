/** Targets (PASS/MISS) and the human-readable table. */

const f = (v, d = 1) => (typeof v === "number" && Number.isFinite(v) ? v.toFixed(d) : "—");
const x = (v) => (typeof v === "number" && Number.isFinite(v) ? `${v.toFixed(2)}x` : "—");
const pad = (s, n) => String(s).padEnd(n);
const lpad = (s, n) => String(s).padStart(n);

function burst(results, kind) {
  const t = results.sections.throughput;
  if (!t) return null;
  const key = Object.keys(t).find((k) => k.startsWith(`${kind}_`));
  return key ? t[key] : null;
}

/** Decimals that show a target's value against its limit: a sub-unit limit (0.15 ms) needs three. */
export function valueDigits(t) {
  return Math.abs(t.limit) < 1 ? 3 : 1;
}

function target(id, what, value, limit, cmp, unit, why) {
  let result;
  if (typeof value !== "number" || !Number.isFinite(value)) result = "N/A";
  else result = (cmp === "<=" ? value <= limit : value >= limit) ? "PASS" : "MISS";
  return { id, what, value: value ?? null, limit, cmp, unit, result, ...(result === "N/A" ? { why } : {}) };
}

/**
 * The targets (2-core machine); scripts/bench/README.md "Targets" lists the same rules. Everything that
 * judges or prints a limit reads it here. The result keys `crossings_100ms` / `holds_100ms` keep their
 * names for the history file; they hold the crossings of `fanout.p99_ms`.
 */
export const TARGETS = {
  start_p50_ratio: 1.1,
  postgres_start_p50_ratio: 1.15,
  /** Issue 43: start-to-dispatch with one webhook subscription ÷ without, p50. */
  webhook_start_p50_ratio: 1.05,
  /** Issue 41 §4: start-to-dispatch in worktree mode on the smaller generated repository ÷ shared, p50. */
  worktree_start_p50_ratio: 1.5,
  cross_instance_wakeup_p50_ms: 5,
  cross_instance_wakeup_p99_ms: 20,
  throughput_ratio: 0.75,
  wakeup_p50_ms: 3,
  wakeup_p99_ms: 10,
  rss_mb: 150,
  /** Design §17: a follow-up that prompts the kept agent starts in at most half the time of a cold one. */
  follow_up_warm_p50_ratio: 0.5,
  fanout: { n: 50, m: 1000, p99_ms: 100 },
  /** Issue 45: against the bare long-poll floor of the same run (suites/fanout.mjs `floorRatios`). */
  floor: { round_trip_cpu_ratio: 2, fanout_p99_ratio: 3 },
  /** Issue 45: the Server's CPU per observe round trip, absolute (ms per call). */
  round_trip_cpu_ms: 0.15,
  /**
   * Issue 45 §4, the cluster fan-out's split cell against one SQLite Server of the same run
   * (suites/cluster-fanout.mjs `ratios`): the worse instance's p99 ≤ the baseline's, and both instances
   * together serve at least this many times the baseline's calls/s.
   */
  cluster: { split_p99_ratio: 1, split_calls_ratio: 1.6 },
};

export function evaluateTargets(results) {
  const s = results.sections;
  const T = TARGETS;
  const quickNote = results.quick ? " (--quick sizes)" : "";
  const msg = burst(results, "message");
  const tool = burst(results, "tool");
  const runnerRss = msg?.ours?.resources?.runner;
  const serverRss = msg?.ours?.resources?.server;
  const cell = s.fanout?.cells?.find((c) => c.n === T.fanout.n && c.m === T.fanout.m);
  const cellName = `N=${T.fanout.n} M=${T.fanout.m}`;
  const na = (name) => results.errors[name] ?? s[name]?.error ?? "not measured";
  const rss = (r) => (r ? Math.max(r.peak_rss_mb, r.hwm_mb) : undefined);
  const noCell = s.fanout && !cell ? `cell ${cellName} not in this grid` : na("fanout");
  // Memory: the cell on a Server of its own (fanout.ownServerCell); the grid's one cell when it is the whole grid.
  const own = s.fanout?.own_server_cell;
  const memoryCell = own ? (own.error ? undefined : own) : cell;
  const noMemoryCell = own?.error ? `own-Server cell: ${own.error.split("\n")[0]}` : noCell;
  return [
    target(
      "start_p50_ratio",
      `start-to-dispatch p50 ≤ ${T.start_p50_ratio}× bare SDK`,
      s.start?.p50_ratio,
      T.start_p50_ratio,
      "<=",
      "x",
      na("start"),
    ),
    target(
      "postgres_start_p50_ratio",
      `start-to-dispatch p50 on PostgreSQL ≤ ${T.postgres_start_p50_ratio}× on SQLite`,
      s.engines?.p50_ratio,
      T.postgres_start_p50_ratio,
      "<=",
      "x",
      na("engines"),
    ),
    target(
      "follow_up_warm_p50_ratio",
      `follow-up start-to-dispatch p50, agent kept ≤ ${T.follow_up_warm_p50_ratio}× cold`,
      s["follow-up"]?.p50_ratio,
      T.follow_up_warm_p50_ratio,
      "<=",
      "x",
      na("follow-up"),
    ),
    target(
      "webhook_start_p50_ratio",
      `start-to-dispatch p50 with one webhook subscription ≤ ${T.webhook_start_p50_ratio}× without${quickNote}`,
      s.webhooks?.p50_ratio,
      T.webhook_start_p50_ratio,
      "<=",
      "x",
      na("webhooks"),
    ),
    target(
      "worktree_start_p50_ratio",
      `start-to-dispatch p50 in worktree mode (${s.workspaces?.files?.small ?? "1000"} files) ≤ ${T.worktree_start_p50_ratio}× shared${quickNote}`,
      s.workspaces?.small_p50_ratio,
      T.worktree_start_p50_ratio,
      "<=",
      "x",
      na("workspaces"),
    ),
    target(
      "cross_instance_wakeup_p50_ms",
      `observe wake-up across instances p50 ≤ ${T.cross_instance_wakeup_p50_ms} ms`,
      s.cluster?.cross_instance?.latency_ms?.p50,
      T.cross_instance_wakeup_p50_ms,
      "<=",
      "ms",
      na("cluster"),
    ),
    target(
      "cross_instance_wakeup_p99_ms",
      `observe wake-up across instances p99 ≤ ${T.cross_instance_wakeup_p99_ms} ms`,
      s.cluster?.cross_instance?.latency_ms?.p99,
      T.cross_instance_wakeup_p99_ms,
      "<=",
      "ms",
      na("cluster"),
    ),
    target(
      "throughput_message_ratio",
      `message burst updates/s ≥ ${T.throughput_ratio}× bare SDK${quickNote}`,
      msg?.ratio,
      T.throughput_ratio,
      ">=",
      "x",
      msg?.error ?? na("throughput"),
    ),
    target(
      "throughput_tool_ratio",
      `tool burst updates/s ≥ ${T.throughput_ratio}× bare SDK${quickNote}`,
      tool?.ratio,
      T.throughput_ratio,
      ">=",
      "x",
      tool?.error ?? na("throughput"),
    ),
    target(
      "wakeup_p50",
      `observe wake-up p50 ≤ ${T.wakeup_p50_ms} ms`,
      s.wakeup?.ours?.latency_ms?.p50,
      T.wakeup_p50_ms,
      "<=",
      "ms",
      na("wakeup"),
    ),
    target(
      "wakeup_p99",
      `observe wake-up p99 ≤ ${T.wakeup_p99_ms} ms`,
      s.wakeup?.ours?.latency_ms?.p99,
      T.wakeup_p99_ms,
      "<=",
      "ms",
      na("wakeup"),
    ),
    target(
      "runner_rss",
      `Runner RSS ≤ ${T.rss_mb} MB during the message burst${quickNote}`,
      rss(runnerRss),
      T.rss_mb,
      "<=",
      "MB",
      msg?.error ?? na("throughput"),
    ),
    target(
      "server_rss",
      `Server RSS ≤ ${T.rss_mb} MB during the message burst${quickNote}`,
      rss(serverRss),
      T.rss_mb,
      "<=",
      "MB",
      msg?.error ?? na("throughput"),
    ),
    target(
      "fanout_p99",
      `${T.fanout.m} observers on ${T.fanout.n} runners: p99 ≤ ${T.fanout.p99_ms} ms`,
      cell?.latency_ms?.p99,
      T.fanout.p99_ms,
      "<=",
      "ms",
      noCell,
    ),
    target(
      "fanout_p99_floor_ratio",
      `${cellName} p99 ≤ ${T.floor.fanout_p99_ratio}× the bare long-poll floor's`,
      s.fanout?.floor_ratios?.find((r) => r.n === T.fanout.n && r.m === T.fanout.m)?.p99,
      T.floor.fanout_p99_ratio,
      "<=",
      "x",
      s.fanout?.floor?.error ?? noCell,
    ),
    target(
      "round_trip_cpu_floor_ratio",
      `observe round trip Server CPU ≤ ${T.floor.round_trip_cpu_ratio}× the floor's`,
      s.fanout?.floor_observe_cost_ratio,
      T.floor.round_trip_cpu_ratio,
      "<=",
      "x",
      s.fanout?.floor?.observe_cost?.error ?? s.fanout?.observe_cost?.error ?? na("fanout"),
    ),
    target(
      "round_trip_cpu_ms",
      `observe round trip Server CPU ≤ ${T.round_trip_cpu_ms} ms per call`,
      s.fanout?.observe_cost?.server_cpu_ms_per_call,
      T.round_trip_cpu_ms,
      "<=",
      "ms",
      s.fanout?.observe_cost?.error ?? na("fanout"),
    ),
    target(
      "cluster_split_p99_ratio",
      `two instances, observers split: worse p99 ≤ ${T.cluster.split_p99_ratio}× one Server's`,
      s["cluster-fanout"]?.ratios?.split_p99,
      T.cluster.split_p99_ratio,
      "<=",
      "x",
      na("cluster-fanout"),
    ),
    target(
      "cluster_split_calls_ratio",
      `two instances, observers split: calls/s ≥ ${T.cluster.split_calls_ratio}× one Server's`,
      s["cluster-fanout"]?.ratios?.split_calls_per_s,
      T.cluster.split_calls_ratio,
      ">=",
      "x",
      na("cluster-fanout"),
    ),
    target(
      "fanout_server_rss",
      `Server RSS ≤ ${T.rss_mb} MB in the fan-out ${cellName} cell (own Server)`,
      rss(memoryCell?.server),
      T.rss_mb,
      "<=",
      "MB",
      noMemoryCell,
    ),
  ];
}

function latencyRow(label, s, n = 30) {
  if (!s) return `  ${pad(label, n)} —\n`;
  return `  ${pad(label, n)}${lpad(s.n, 6)}${lpad(f(s.p50, 2), 10)}${lpad(f(s.p95, 2), 10)}${lpad(f(s.p99, 2), 10)}${lpad(f(s.max, 2), 10)}\n`;
}

export function render(results) {
  const m = results.machine;
  const s = results.sections;
  let out = "\n";
  out += `WebCodex bench${results.quick ? " (--quick)" : ""} — ${m.cores} × ${m.cpu_model}, ${m.mem_total_mb} MB, node ${m.node}, `;
  out += `load ${m.loadavg_at_start.map((v) => v.toFixed(2)).join("/")} → ${(m.loadavg_at_end ?? []).map((v) => v.toFixed(2)).join("/")}\n`;
  out += `commit ${m.git_commit ?? "?"}, ${f(results.duration_s, 0)} s\n\n`;

  const head = (title) =>
    `${title}\n  ${pad("", 30)}${lpad("n", 6)}${lpad("p50", 10)}${lpad("p95", 10)}${lpad("p99", 10)}${lpad("max", 10)}\n`;

  if (s.start) {
    out += head("Start-to-dispatch (ms): client asks → agent receives session/prompt");
    out += latencyRow("bare ACP SDK (spawn+init+new)", s.start.baseline?.latency_ms);
    out += latencyRow("ours (MCP start_coding_agent)", s.start.ours?.latency_ms);
    out += `  ${pad("ratio ours/bare", 30)}${lpad("", 6)}${lpad(x(s.start.p50_ratio), 10)}${lpad(x(s.start.p95_ratio), 10)}${lpad(x(s.start.p99_ratio), 10)}\n`;
    if (s.start.ours?.duplicate_dispatches) out += `  !! duplicate dispatches: ${s.start.ours.duplicate_dispatches}\n`;
    if (s.start.ours?.stages) out += renderStages("per stage (Runner's own timings, ms)", s.start.ours.stages);
    if (s.start.spawn_cost) out += renderSpawnCost(s.start.spawn_cost);
    if (s.start.error) out += `  ours: ERROR ${s.start.error.split("\n")[0]}\n`;
    out += "\n";
  }

  if (s.engines) {
    out += head("Start-to-dispatch (ms) by state engine, the two stacks alternating run by run");
    out += latencyRow("Server state on SQLite", s.engines.sqlite?.latency_ms);
    out += latencyRow("Server state on PostgreSQL", s.engines.postgres?.latency_ms);
    out += `  ${pad("ratio PostgreSQL/SQLite", 30)}${lpad("", 6)}${lpad(x(s.engines.p50_ratio), 10)}${lpad(x(s.engines.p95_ratio), 10)}\n`;
    if (s.engines.duplicate_dispatches) out += `  !! duplicate dispatches: ${s.engines.duplicate_dispatches}\n`;
    if (s.engines.failure_count) out += `  failures: ${s.engines.failure_count}\n`;
    out += "\n";
  }

  const follow = s["follow-up"];
  if (follow) {
    out += head("Follow-up start-to-dispatch (ms): keep_agent_alive_secs 0 (cold) vs > 0 (warm), alternating");
    out += latencyRow("cold (spawn, init, resume)", follow.cold?.latency_ms);
    out += latencyRow("warm (kept agent prompted)", follow.warm?.latency_ms);
    out += `  ${pad("ratio warm/cold", 30)}${lpad("", 6)}${lpad(x(follow.p50_ratio), 10)}${lpad(x(follow.p95_ratio), 10)}\n`;
    out += `  warm follow-ups that reached the kept agent: ${follow.warm_hits ?? 0} of ${follow.warm?.runs ?? 0}\n`;
    if (follow.duplicate_dispatches) out += `  !! duplicate dispatches: ${follow.duplicate_dispatches}\n`;
    if (follow.failure_count) out += `  failures: ${follow.failure_count}\n`;
    out += "\n";
  }
  if (s.webhooks) out += renderWebhooks(s.webhooks, head);
  if (s.workspaces) out += renderWorkspaces(s.workspaces, head);

  if (s.cluster) {
    out += head("Observe wake-up (ms) on two Server instances sharing PostgreSQL, Runner linked to the first");
    out += latencyRow("observer on that instance", s.cluster.same_instance?.latency_ms);
    out += latencyRow("observer on the other instance", s.cluster.cross_instance?.latency_ms);
    out += `  ${pad("ratio other/same", 30)}${lpad("", 6)}${lpad(x(s.cluster.p50_ratio), 10)}\n\n`;
  }

  if (s.throughput) {
    const reps = Object.values(s.throughput)[0]?.reps ?? 1;
    out += `Throughput: agent starts emitting (ledger) → last update visible to the reader${reps > 1 ? ` (median of ${reps} alternating runs; RSS/CPU of the first run, on a fresh stack)` : ""}\n`;
    out += `  ${pad("", 30)}${lpad("updates", 9)}${lpad("ms", 9)}${lpad("updates/s", 12)}${lpad("KiB/s", 10)}${lpad("ratio", 8)}\n`;
    for (const [key, b] of Object.entries(s.throughput)) {
      const row = (label, r, ratioValue) =>
        r
          ? `  ${pad(label, 30)}${lpad(r.count, 9)}${lpad(f(r.elapsed_ms, 0), 9)}${lpad(f(r.updates_per_s, 0), 12)}${lpad(f(r.bytes_per_s / 1024, 0), 10)}${lpad(ratioValue, 8)}\n`
          : `  ${pad(label, 30)} —${b.error ? ` ERROR ${b.error.split("\n")[0].slice(0, 80)}` : ""}\n`;
      out += row(`${key} bare SDK`, b.baseline, "");
      out += row(`${key} ours (MCP observer)`, b.ours, x(b.ratio));
      if (b.ours) {
        out += `  ${pad("", 30)}events seen ${b.ours.events_seen}, payload ${b.ours.payload_bytes_seen}/${b.ours.payload_bytes} B, observe calls ${b.ours.observe_calls}, Runner had it all at ${f(b.ours.runner_terminal_after_ms, 0)} ms${b.ours.history_lost ? ", HISTORY LOST" : ""}, state ${b.ours.state}\n`;
        for (const [name, r] of Object.entries(b.ours.resources ?? {})) {
          const after = b.ours.resources_max_over_reps?.[name];
          out += `  ${pad("", 30)}${pad(name, 7)} peak RSS ${f(r.peak_rss_mb)} MB (HWM ${f(r.hwm_mb)} MB), CPU ${f(r.cpu_ms, 0)} ms`;
          out += b.reps > 1 && after ? `; after ${b.reps} bursts peak RSS ${f(after.peak_rss_mb)} MB\n` : "\n";
        }
      }
    }
    out += "\n";
  }

  if (s.wakeup) {
    out += head(
      `Observe wake-up (ms): agent emits (tap) → observer returns; one update every ${s.wakeup.baseline?.interval_ms} ms`,
    );
    out += latencyRow("bare SDK reader (reference)", s.wakeup.baseline?.latency_ms);
    out += latencyRow("ours, observer already waiting", s.wakeup.ours?.latency_ms);
    out += latencyRow("ours, every tick", s.wakeup.ours?.latency_all_ms);
    out += latencyRow("Server alone (sim runner → MCP)", s.wakeup.server_only?.latency_ms);
    if (s.wakeup.error) out += `  ours: ERROR ${s.wakeup.error.split("\n")[0]}\n`;
    out += "\n";
  }

  if (s.fanout) {
    const ns = [...new Set(s.fanout.cells.map((c) => c.n))];
    const ms = [...new Set(s.fanout.cells.map((c) => c.m))];
    out += `Fan-out: p99 / p50 observe latency (ms), one event every ${s.fanout.interval_ms} ms per run, ${s.fanout.duration_ms} ms per cell, ${s.fanout.client ?? "sdk"} observers\n`;
    out += `  ${pad("", 8)}${ms.map((mm) => lpad(`M=${mm}`, 18)).join("")}\n`;
    for (const n of ns) {
      out += `  ${pad(`N=${n}`, 8)}`;
      for (const mm of ms) {
        const c = s.fanout.cells.find((cc) => cc.n === n && cc.m === mm);
        out += lpad(c ? `${f(c.latency_ms?.p99)} / ${f(c.latency_ms?.p50)}` : "—", 18);
      }
      out += "\n";
    }
    out += "  observe calls/s served | Server CPU share | Server peak RSS MB\n";
    for (const n of ns) {
      out += `  ${pad(`N=${n}`, 8)}`;
      for (const mm of ms) {
        const c = s.fanout.cells.find((cc) => cc.n === n && cc.m === mm);
        out += lpad(
          c ? `${f(c.calls_per_s, 0)} | ${f(c.cpu_share?.server, 2)} | ${f(c.server?.peak_rss_mb, 0)}` : "—",
          18,
        );
      }
      out += "\n";
    }
    const own = s.fanout.own_server_cell;
    if (own?.error)
      out += `  N=${TARGETS.fanout.n} M=${TARGETS.fanout.m} on a Server of its own: ERROR ${own.error.split("\n")[0]}\n`;
    else if (own) {
      out += `  N=${own.n} M=${own.m} on a Server of its own (memory target): p99 / p50 ${f(own.latency_ms?.p99)} / ${f(own.latency_ms?.p50)} ms, `;
      out += `${f(own.calls_per_s, 0)} calls/s, Server CPU share ${f(own.cpu_share?.server, 2)}, `;
      out += `peak RSS ${f(own.server?.peak_rss_mb)} MB (HWM ${f(own.server?.hwm_mb)} MB)\n`;
    }
    const oc = s.fanout.observe_cost;
    if (oc && !oc.error) {
      out += `  observe round trip (8 callers, wait_secs=0, nothing new): ${f(oc.calls_per_s, 0)} calls/s, `;
      out += `Server CPU ${f(oc.server_cpu_ms_per_call, 2)} ms per call (Server CPU share ${f(oc.server_cpu_share, 2)}, callers ${f(oc.observers_cpu_share, 2)})\n`;
    }
    out += renderFloor(s.fanout, ns, ms);
    const errs = s.fanout.cells.filter((c) => c.errors && Object.keys(c.errors).length > 0);
    for (const c of errs) out += `  N=${c.n} M=${c.m} errors: ${JSON.stringify(c.errors).slice(0, 200)}\n`;
    out += `  p99 first above ${TARGETS.fanout.p99_ms} ms: ${Object.entries(s.fanout.crossings_100ms ?? {})
      .map(([k, v]) => `${k} at ${v === null ? "none of the M tried" : `M=${v}`}`)
      .join("; ")}\n`;
    out += `  largest M holding p99 ≤ ${TARGETS.fanout.p99_ms} ms: ${Object.entries(s.fanout.holds_100ms ?? {})
      .map(([k, v]) => `${k} ${v === null ? "none" : `M=${v}`}`)
      .join("; ")}\n\n`;
  }

  if (s["cluster-fanout"]) out += renderClusterFanout(s["cluster-fanout"]);
  if (s.links) out += renderLinks(s.links);

  if (s.barrier) {
    out += "Barrier cost (scripts/bench/barrier.mjs): the Runner's commit right before session/prompt\n";
    const b = s.barrier;
    if (b.durable_barrier && b.non_durable_write) {
      out += `  ${pad("", 36)}${lpad("n", 6)}${lpad("median", 10)}${lpad("p99", 10)}${lpad("max", 10)}\n`;
      for (const [label, r] of [
        [`durable (${b.durable_barrier.pragmas ?? "FULL"})`, b.durable_barrier],
        [`non-durable (${b.non_durable_write.pragmas ?? "OFF"})`, b.non_durable_write],
      ]) {
        out += `  ${pad(label.slice(0, 36), 36)}${lpad(r.n, 6)}${lpad(f(r.median_ms, 3), 10)}${lpad(f(r.p99_ms, 3), 10)}${lpad(f(r.max_ms, 3), 10)}\n`;
      }
      out += `  median overhead of durability: ${f(b.median_overhead_ms, 3)} ms\n`;
    } else out += renderFlat(b, "  ");
    out += "\n";
  }

  if (s.dispatch?.rows) {
    out +=
      "MCP dispatch (suites/dispatch.mjs): Server CPU per tools/call, ratio to the v1 SDK path in the same process\n";
    for (const r of s.dispatch.rows) {
      out += `  ${pad(r.era, 12)}${pad(r.path, 10)}${lpad(r.cpu_us_per_request, 7)} µs${lpad(`${f(r.ratio_to_v1, 2)}×`, 9)}\n`;
    }
    out += "\n";
  }

  if (s.peer) out += renderPeer(s.peer);

  const errors = Object.entries(results.errors);
  if (errors.length) {
    out += "Errors\n";
    for (const [k, v] of errors) out += `  ${k}: ${String(v).split("\n")[0].slice(0, 200)}\n`;
    out += "\n";
  }

  out += "Targets\n";
  for (const t of results.targets) {
    const value = t.unit === "x" ? x(t.value) : `${f(t.value, valueDigits(t))} ${t.unit}`;
    out += `  ${pad(t.result, 5)} ${pad(t.what, 58)} ${lpad(t.result === "N/A" ? "" : value, 10)}${t.why ? `  (${String(t.why).split("\n")[0].slice(0, 90)})` : ""}\n`;
  }
  out += "\n";
  return out;
}

function renderWebhooks(w, head) {
  let out = head("Start-to-dispatch (ms) with and without one webhook subscription, the two stacks alternating");
  out += latencyRow("no subscription", w.without?.latency_ms);
  out += latencyRow("one subscription (run events)", w.with?.latency_ms);
  out += `  ${pad("ratio with/without", 30)}${lpad("", 6)}${lpad(x(w.p50_ratio), 10)}${lpad(x(w.p95_ratio), 10)}${lpad(x(w.p99_ratio), 10)}\n`;
  out += "  delivery to the receiver (ms):\n";
  out += latencyRow("Runner terminal → run.terminal", w.delivery_ms?.terminal);
  out += latencyRow("dispatch → run.started", w.delivery_ms?.started_after_dispatch);
  out += `  events received ${w.events_received}, run.terminal missing ${w.missing_terminal_deliveries}, delivered again ${w.extra_deliveries}`;
  out += w.failure_count ? `, failures ${w.failure_count}` : "";
  out += w.duplicate_dispatches ? `, !! duplicate dispatches ${w.duplicate_dispatches}` : "";
  return `${out}\n\n`;
}

function renderWorkspaces(w, head) {
  let out = head(
    `Start-to-dispatch (ms) by workspace mode, generated repositories of ${w.files?.small} / ${w.files?.large} files`,
  );
  out += latencyRow(`shared (${w.files?.small} files)`, w.shared?.latency_ms);
  out += latencyRow(`worktree (${w.files?.small} files)`, w.worktree_small?.latency_ms);
  out += latencyRow(`worktree (${w.files?.large} files)`, w.worktree_large?.latency_ms);
  out +=
    "  p50 by stage (ms; before = admission and the hops, then the Runner's stages, the worktree made in spawn):\n";
  for (const [label, k] of [
    ["shared", "shared"],
    [`worktree ${w.files?.small}`, "worktree_small"],
    [`worktree ${w.files?.large}`, "worktree_large"],
  ]) {
    const st = w[k]?.stages_ms ?? {};
    const parts = Object.entries(st).map(
      ([name, v]) => `${name.replace("before_runner_stages_ms", "before")} ${f(v?.p50, 0)}`,
    );
    out += `    ${pad(label, 16)}${parts.join(", ")}\n`;
  }
  out += `  ${pad(`ratio worktree/shared ${w.files?.small}`, 30)}${lpad("", 6)}${lpad(x(w.small_p50_ratio), 10)}${lpad(x(w.small_p95_ratio), 10)}\n`;
  out += `  ${pad(`ratio worktree/shared ${w.files?.large}`, 30)}${lpad("", 6)}${lpad(x(w.large_p50_ratio), 10)}${lpad(x(w.large_p95_ratio), 10)}\n`;
  if (w.failure_count) out += `  failures: ${w.failure_count}\n`;
  if (w.duplicate_dispatches) out += `  !! duplicate dispatches: ${w.duplicate_dispatches}\n`;
  const c = w.changes;
  if (c?.error) out += `  get_coding_agent_changes: ERROR ${c.error.split("\n")[0].slice(0, 160)}\n`;
  else if (c) {
    out += `  get_coding_agent_changes on a ${c.change_files}-file change (${c.pages} page(s), ${c.files_listed} files listed${c.files_truncated ? ", list truncated" : ""}, ${c.diff_bytes} B of diff):\n`;
    out += latencyRow("ours, first page", c.ours_first_page_ms);
    out += latencyRow("ours, every page", c.ours_all_pages_ms);
    out += latencyRow("git diff --numstat + git diff", c.bare_git_ms);
    out += `  ${pad("ratio ours/git", 30)}${lpad("", 6)}${lpad(x(c.p50_ratio), 10)}\n`;
  }
  return `${out}\n`;
}

function renderClusterFanout(c) {
  let out = `Fan-out across two Server instances on PostgreSQL, N=${c.n} × M=${c.m}, Runners linked to A, ${c.duration_ms} ms per cell (ms)\n`;
  out += `  ${pad("", 30)}${lpad("n", 6)}${lpad("p50", 10)}${lpad("p95", 10)}${lpad("p99", 10)}${lpad("max", 10)}\n`;
  out += latencyRow("one Server on SQLite (baseline)", c.baseline_sqlite?.latency_ms);
  out += latencyRow("split: observers on A", c.split?.by_group?.a);
  out += latencyRow("split: observers on B", c.split?.by_group?.b);
  out += latencyRow("every observer on B", c.all_on_b?.latency_ms);
  out += latencyRow("split, own /_wc/ listener: A", c.split_own_listener?.by_group?.a);
  out += latencyRow("split, own /_wc/ listener: B", c.split_own_listener?.by_group?.b);
  const r = c.ratios ?? {};
  out += `  ratio to the baseline p50/p99: split A ${x(r.split_a_p50)}/${x(r.split_a_p99)}, split B ${x(r.split_b_p50)}/${x(r.split_b_p99)}, all on B ${x(r.all_on_b_p50)}/${x(r.all_on_b_p99)}\n`;
  for (const [label, cell] of [
    ["baseline", c.baseline_sqlite],
    ["split", c.split],
    ["all on B", c.all_on_b],
    ["own /_wc", c.split_own_listener],
  ]) {
    if (!cell) continue;
    const procs = Object.entries(cell.processes ?? {})
      .map(([name, p]) => `${name} CPU ${f(cell.cpu_share?.[name], 2)}, ${f(p.peak_rss_mb, 0)} MB`)
      .join(", ");
    out += `  ${pad(label, 9)}${f(cell.calls_per_s, 0)} calls/s; ${procs}`;
    out +=
      cell.errors && Object.keys(cell.errors).length ? `; errors ${JSON.stringify(cell.errors).slice(0, 120)}` : "";
    out += "\n";
  }
  return `${out}\n`;
}

function renderLinks(l) {
  let out =
    "Idle Runner links: simulated Runners (real WebSocket + hello), one SQLite Server / two instances on PostgreSQL\n";
  for (const [label, r] of [
    ["SQLite, one instance", l.sqlite_one],
    ["PostgreSQL, two instances", l.postgres_two],
  ]) {
    if (!r) continue;
    if (r.error) {
      out += `  ${label}: ERROR ${r.error.split("\n")[0].slice(0, 160)}\n`;
      continue;
    }
    out += `  ${label}: ${r.runners} links, ${f(r.hello.acked_per_s, 0)} hellos acked/s (≤ ${r.connect_concurrency} in flight; hello p50/p99 ${f(r.hello.hello_ms?.p50, 1)}/${f(r.hello.hello_ms?.p99, 1)} ms), ${r.open_at_stop ?? "?"} open at the end; sim process ${f(r.sim_runners?.rss_mb, 0)} MB\n`;
    for (const [name, i] of Object.entries(r.per_instance ?? {})) {
      out += `    ${pad(name, 9)}${lpad(i.links, 6)} links: RSS ${f(i.rss_before_mb, 0)} → ${f(i.rss_after_mb, 0)} MB (${f(i.kb_per_link, 1)} KB/link), fds ${i.fds_before} → ${i.fds_after}, `;
      out += `hello CPU ${f(i.hello_cpu_ms_per_link, 2)} ms/link, idle CPU share ${f(i.idle_cpu_share, 3)} over ${f(r.idle_ms / 1000, 0)} s\n`;
    }
  }
  return `${out}\n`;
}

/** The spawn stage's share that is execa's: its spawn call and the CPU beside the booting agent, vs node:child_process. */
function renderSpawnCost(c) {
  if (c.error) return `  spawn cost: ERROR ${c.error.split("\n")[0]}\n`;
  let out = "  spawn (the bench process spawning the fake agent, ms; suites/start-dispatch.mjs spawnCost):\n";
  for (const [label, key] of [
    ["node:child_process call", ["child_process", "call_ms"]],
    ["execa call", ["execa", "call_ms"]],
    ["node:child_process CPU", ["child_process", "cpu_ms"]],
    ["execa CPU", ["execa", "cpu_ms"]],
  ]) {
    const st = c[key[0]][key[1]];
    out += `    ${pad(label, 28)}${lpad(st.n, 4)}${lpad(f(st.p50, 2), 10)}${lpad(f(st.p95, 2), 10)}${lpad(f(st.p99, 2), 10)}${lpad(f(st.max, 2), 10)}\n`;
  }
  out += `    ${pad("ratio execa/child_process", 28)}${lpad("", 4)}call ${x(c.call_ratio)}, CPU ${x(c.cpu_ratio)} (p50)\n`;
  return out;
}

function renderStages(title, stages) {
  let out = `  ${title}:\n`;
  for (const [name, st] of Object.entries(stages)) {
    out += `    ${pad(name, 28)}${lpad(st.n, 4)}${lpad(f(st.p50, 2), 10)}${lpad(f(st.p95, 2), 10)}${lpad(f(st.p99, 2), 10)}${lpad(f(st.max, 2), 10)}\n`;
  }
  return out;
}

function renderFlat(value, indent, prefix = "") {
  let out = "";
  if (value && typeof value === "object" && !Array.isArray(value)) {
    for (const [k, v] of Object.entries(value)) {
      if (v && typeof v === "object" && !Array.isArray(v)) out += renderFlat(v, indent, `${prefix}${k}.`);
      else if (!Array.isArray(v)) out += `${indent}${prefix}${k}: ${typeof v === "number" ? f(v, 3) : v}\n`;
    }
  }
  return out;
}

const PEER_LABELS = {
  acpx: "acpx exec (Node 22)",
  runner_exec: "webcodex-runner exec",
  full_stack: "webcodex run (warm stack)",
};

function renderPeer(p) {
  if (p.skipped) return `Peer (acpx): SKIPPED — ${p.skipped}\n\n`;
  let out = `Peer: one-shot hello prompt as a whole process, fake agent, median of ${p.runs} alternating runs (acpx ${p.peer?.acpx ?? "?"} on node ${p.peer?.node ?? "?"})\n`;
  out += `  ${pad("", 28)}${lpad("wall ms", 9)}${lpad("1st upd", 9)}${lpad("dispatch", 9)}${lpad("CPU ms", 8)}${lpad("+daemons", 9)}${lpad("RSS MB", 8)}\n`;
  for (const [name, c] of Object.entries(p.contenders ?? {})) {
    out += `  ${pad(PEER_LABELS[name] ?? name, 28)}${lpad(f(c.wall_ms?.p50, 0), 9)}${lpad(f(c.first_update_ms?.p50, 0), 9)}${lpad(f(c.dispatch_ms?.p50, 0), 9)}`;
    out += `${lpad(f(c.cpu_ms?.p50, 0), 8)}${lpad(f(c.cpu_total_ms?.p50, 0), 9)}${lpad(f(c.peak_rss_mb?.p50, 0), 8)}`;
    out += c.failures ? `  ${c.failures} failed: ${String(c.first_error).slice(0, 80)}` : "";
    out += c.duplicate_dispatches ? `  !! ${c.duplicate_dispatches} duplicate dispatches` : "";
    out += "\n";
  }
  for (const [name, r] of Object.entries(p.ratios ?? {})) {
    out += `  ${pad(`${name} / acpx`, 28)}${lpad(x(r.wall_p50), 9)}${lpad(x(r.first_update_p50), 9)}${lpad(x(r.dispatch_p50), 9)}${lpad(x(r.cpu_p50), 8)}${lpad(x(r.cpu_total_p50), 9)}${lpad(x(r.peak_rss_p50), 8)}\n`;
  }
  out +=
    "  (CPU: the client's process tree incl. the agent; +daemons adds the warm Server and Runner; RSS: the client's tree)\n";
  if (p.full_stack_error) out += `  full stack: ERROR ${p.full_stack_error.split("\n")[0]}\n`;
  return `${out}\n`;
}

/** The floor (issue 45): the bare long-poll server's grid, and every fan-out figure as ours ÷ floor. */
function renderFloor(fo, ns, ms) {
  const floor = fo.floor;
  if (!floor) return "";
  if (floor.error) return `  floor (bare node:http long-poll): ERROR ${floor.error.split("\n")[0]}\n`;
  let out = "  floor (bare node:http long-poll, same event flow and bodies, same run): p99 / p50 ms\n";
  const cellOf = (list, n, m) => list.find((c) => c.n === n && c.m === m);
  for (const n of ns) {
    out += `  ${pad(`N=${n}`, 8)}`;
    for (const m of ms) {
      const c = cellOf(floor.cells, n, m);
      out += lpad(c ? `${f(c.latency_ms?.p99)} / ${f(c.latency_ms?.p50)}` : "—", 18);
    }
    out += "\n";
  }
  out += "  ours ÷ floor: p99 | p50 | Server CPU per answered observe | answer bytes\n";
  for (const n of ns) {
    out += `  ${pad(`N=${n}`, 8)}`;
    for (const m of ms) {
      const r = cellOf(fo.floor_ratios ?? [], n, m);
      out += lpad(
        r ? `${f(r.p99, 1)}|${f(r.p50, 1)}|${f(r.server_cpu_ms_per_call, 1)}|${f(r.answer_bytes_p50, 2)}` : "—",
        18,
      );
    }
    out += "\n";
  }
  const oc = floor.observe_cost;
  if (oc && !oc.error) {
    out += `  floor observe round trip (8 callers, wait_secs=0): ${f(oc.calls_per_s, 0)} calls/s, `;
    out += `CPU ${f(oc.server_cpu_ms_per_call, 3)} ms per call; ours ÷ floor ${f(fo.floor_observe_cost_ratio, 2)}\n`;
  }
  return out;
}
