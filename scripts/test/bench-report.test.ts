/** The bench's report: targets, the largest M that holds, the picture and the history line. */
import { describe, expect, it } from "vitest";
// @ts-expect-error plain .mjs scripts without type declarations
import { historyLine } from "../bench/lib/history.mjs";
// @ts-expect-error plain .mjs scripts without type declarations
import { svgOf } from "../bench/lib/picture.mjs";
// @ts-expect-error plain .mjs scripts without type declarations
import { evaluateTargets, render, TARGETS } from "../bench/lib/report.mjs";
// @ts-expect-error plain .mjs scripts without type declarations
import { holds, ownServerCell } from "../bench/suites/fanout.mjs";

const cell = (n: number, m: number, p99: number) => ({
  n,
  m,
  latency_ms: { p99, p50: p99 / 2 },
  server: { peak_rss_mb: 90, hwm_mb: 95 },
});

function results() {
  return {
    started_at: "2026-11-30T17:00:00.000Z",
    quick: false,
    machine: { cpu_model: "test cpu", cores: 2, node: "v20", loadavg_at_start: [1, 2, 3], git_commit: "abc1234" },
    errors: {},
    sections: {
      start: { p50_ratio: 1.05 },
      throughput: { message_100000: { ratio: 0.7 }, tool_10000: { ratio: 0.9 } },
      fanout: { cells: [cell(10, 500, 60), cell(10, 1000, 120), cell(50, 500, 80), cell(50, 1000, 99)] },
    },
    targets: [] as unknown[],
  };
}

describe("bench report", () => {
  it("reports the largest M whose p99 and every smaller M's held the limit", () => {
    const cells = [cell(10, 10, 5), cell(10, 100, 150), cell(10, 500, 90), cell(50, 10, 5), cell(50, 100, 40)];
    expect(holds(cells, 100)).toEqual({ "N=10": 10, "N=50": 100 });
    expect(holds([cell(1, 10, 101)], 100)).toEqual({ "N=1": null });
  });

  it("judges the issue-17 targets: 0.75× throughput, 1.1× start, N=50 × M=1000 fan-out p99 and Server RSS", () => {
    const byId = Object.fromEntries(evaluateTargets(results()).map((t: { id: string }) => [t.id, t]));
    expect(byId.throughput_message_ratio.result).toBe("MISS");
    expect(byId.throughput_tool_ratio.result).toBe("PASS");
    expect(byId.start_p50_ratio.result).toBe("PASS");
    expect(byId.fanout_p99).toMatchObject({ value: 99, result: "PASS" });
    expect(byId.fanout_server_rss).toMatchObject({ value: 95, result: "PASS" });
    expect(byId.wakeup_p50.result).toBe("N/A");
  });

  it("judges issue 45's absolute round trip and the two instances' split cell against one Server of the same run", () => {
    const r = results();
    const sections = r.sections as Record<string, unknown>;
    let byId = Object.fromEntries(evaluateTargets(r).map((t: { id: string }) => [t.id, t]));
    expect(byId.round_trip_cpu_ms.result).toBe("N/A");
    expect(byId.cluster_split_p99_ratio).toMatchObject({ result: "N/A", why: "not measured" });
    expect(byId.cluster_split_calls_ratio).toMatchObject({ result: "N/A", why: "not measured" });

    Object.assign(r.sections.fanout, { observe_cost: { server_cpu_ms_per_call: 0.42 } });
    sections["cluster-fanout"] = { ratios: { split_p99: 2.01, split_calls_per_s: 0.59 } };
    byId = Object.fromEntries(evaluateTargets(r).map((t: { id: string }) => [t.id, t]));
    expect(byId.round_trip_cpu_ms).toMatchObject({ value: 0.42, limit: TARGETS.round_trip_cpu_ms, result: "MISS" });
    expect(byId.cluster_split_p99_ratio).toMatchObject({ value: 2.01, result: "MISS" });
    expect(byId.cluster_split_calls_ratio).toMatchObject({ value: 0.59, cmp: ">=", result: "MISS" });
    // A limit under 1 ms is printed to the thousandth: 0.42 against 0.15, not "0.4".
    r.targets = evaluateTargets(r);
    expect(render(r)).toMatch(/MISS {2}observe round trip Server CPU ≤ 0\.15 ms per call +0\.420 ms/);

    Object.assign(r.sections.fanout, { observe_cost: { server_cpu_ms_per_call: 0.12 } });
    sections["cluster-fanout"] = { ratios: { split_p99: 0.9, split_calls_per_s: 1.7 } };
    byId = Object.fromEntries(evaluateTargets(r).map((t: { id: string }) => [t.id, t]));
    expect(byId.round_trip_cpu_ms.result).toBe("PASS");
    expect(byId.cluster_split_p99_ratio.result).toBe("PASS");
    expect(byId.cluster_split_calls_ratio.result).toBe("PASS");
  });

  it("reads the fan-out memory target from the cell on a Server of its own, the p99 target from the grid", () => {
    const r = results();
    const grid = r.sections.fanout as Record<string, unknown>;
    grid.own_server_cell = { ...cell(50, 1000, 70), server: { peak_rss_mb: 140, hwm_mb: 151 } };
    let byId = Object.fromEntries(evaluateTargets(r).map((t: { id: string }) => [t.id, t]));
    expect(byId.fanout_server_rss).toMatchObject({ value: 151, result: "MISS" });
    expect(byId.fanout_p99).toMatchObject({ value: 99, result: "PASS" });
    grid.own_server_cell = { error: "sim runners failed: boom\nstack" };
    byId = Object.fromEntries(evaluateTargets(r).map((t: { id: string }) => [t.id, t]));
    expect(byId.fanout_server_rss).toMatchObject({ value: null, result: "N/A" });
    expect(byId.fanout_server_rss.why).toBe("own-Server cell: sim runners failed: boom");
  });

  it("runs the memory target's cell again only when the grid holds it among other cells", async () => {
    const ctx = {
      log: () => {
        throw new Error("no cell should run");
      },
    };
    const target = { n: 50, m: 1000 };
    expect(await ownServerCell(ctx, { ns: [50], ms: [1000] }, target)).toBeNull(); // the grid's one cell is fresh
    expect(await ownServerCell(ctx, { ns: [1, 10], ms: [10, 100] }, target)).toBeNull(); // --quick grid
  });

  it("draws every fan-out cell's p99 and every measured target into the picture", () => {
    const r = results();
    r.targets = evaluateTargets(r);
    const svg: string = svgOf(r);
    for (const p99 of ["60.0", "120.0", "80.0", "99.0"]) expect(svg).toContain(`>${p99}</text>`);
    expect(svg).toContain("M=1000");
    expect(svg).toContain("message burst updates/s ≥ 0.75× bare SDK");
    expect(svg).toContain("0.70×");
  });

  it("prints the fan-out crossings against the target's p99 limit, not a number of its own", () => {
    const limit = TARGETS.fanout.p99_ms;
    try {
      TARGETS.fanout.p99_ms = 87;
      const r = results();
      Object.assign(r.sections.fanout, { crossings_100ms: { "N=10": 1000 }, holds_100ms: { "N=10": 500 } });
      r.targets = evaluateTargets(r);
      const text: string = render(r);
      expect(text).toContain("p99 first above 87 ms: N=10 at M=1000");
      expect(text).toContain("largest M holding p99 ≤ 87 ms: N=10 M=500");
      expect(text).not.toMatch(/\b100 ms\b/);
    } finally {
      TARGETS.fanout.p99_ms = limit;
    }
  });

  it("writes one history line holding each target's value and verdict and the fan-out grid", () => {
    const r = results();
    r.targets = evaluateTargets(r);
    const line = historyLine(r);
    expect(line.commit).toBe("abc1234");
    expect(line.targets.throughput_message_ratio).toEqual({ value: 0.7, result: "MISS" });
    expect(line.fanout_p99_ms).toEqual({ "10x500": 60, "10x1000": 120, "50x500": 80, "50x1000": 99 });
    expect(JSON.parse(JSON.stringify(line))).toEqual(line);
  });
});
