/**
 * The bench's picture: an SVG built from the results (the fan-out grid as a
 * heat map of p99, and one bar per target scored as value ÷ limit, so 1.0 is
 * the target line for every figure), rasterized to PNG with @resvg/resvg-js
 * (prebuilt binaries inside npm packages; system fonts for the labels).
 */
import { TARGETS, valueDigits } from "./report.mjs";

const W = 1100;
const H = 560;
const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
const num = (v, d = 1) => (typeof v === "number" && Number.isFinite(v) ? v.toFixed(d) : "—");

/** Heat colour of a p99 against the fan-out limit (TARGETS.fanout.p99_ms): green → amber at the limit → red at 2× the limit. */
function heat(p99, limit) {
  if (typeof p99 !== "number" || !Number.isFinite(p99)) return "#d0d0d0";
  const t = Math.max(0, Math.min(1, p99 / (2 * limit)));
  const hue = 120 * (1 - t); // 120 green … 60 amber (at the limit) … 0 red
  return `hsl(${hue.toFixed(0)}, 65%, ${p99 > limit ? 55 : 60}%)`;
}

function text(x, y, s, { size = 13, anchor = "start", weight = "normal", fill = "#222" } = {}) {
  return `<text x="${x}" y="${y}" font-family="DejaVu Sans, Arial, sans-serif" font-size="${size}" text-anchor="${anchor}" font-weight="${weight}" fill="${fill}">${esc(s)}</text>`;
}

function heatMap(results, x0, y0, w, h) {
  const cells = results.sections.fanout?.cells ?? [];
  let out = text(x0, y0 - 14, "Fan-out: observe p99 (ms) by N runs × M observers", { size: 14, weight: "bold" });
  if (cells.length === 0) return out + text(x0, y0 + 20, "not measured in this run");
  const ns = [...new Set(cells.map((c) => c.n))].sort((a, b) => a - b);
  const ms = [...new Set(cells.map((c) => c.m))].sort((a, b) => a - b);
  const labelW = 60;
  const cw = (w - labelW) / ms.length;
  const ch = Math.min(70, (h - 40) / ns.length);
  ms.forEach((m, j) => {
    out += text(x0 + labelW + j * cw + cw / 2, y0 + 14, `M=${m}`, { anchor: "middle" });
  });
  ns.forEach((n, i) => {
    const y = y0 + 24 + i * ch;
    out += text(x0, y + ch / 2 + 5, `N=${n}`);
    ms.forEach((m, j) => {
      const c = cells.find((cc) => cc.n === n && cc.m === m);
      const p99 = c?.latency_ms?.p99;
      const x = x0 + labelW + j * cw;
      out += `<rect x="${x + 2}" y="${y + 2}" width="${cw - 4}" height="${ch - 4}" rx="4" fill="${heat(p99, TARGETS.fanout.p99_ms)}"/>`;
      out += text(x + cw / 2, y + ch / 2, c ? num(p99) : "—", { anchor: "middle", weight: "bold", size: 15 });
      if (c) out += text(x + cw / 2, y + ch / 2 + 17, `p50 ${num(c.latency_ms?.p50)}`, { anchor: "middle", size: 11 });
    });
  });
  const yl = y0 + 24 + ns.length * ch + 18;
  out += text(
    x0,
    yl,
    `green ≤ ${TARGETS.fanout.p99_ms / 2} ms, amber at the ${TARGETS.fanout.p99_ms} ms limit, red ≥ ${2 * TARGETS.fanout.p99_ms} ms`,
    {
      size: 11,
      fill: "#555",
    },
  );
  return out;
}

function bars(results, x0, y0, w, h) {
  let out = text(x0, y0 - 14, "Targets: value ÷ limit (dashed line = the target)", { size: 14, weight: "bold" });
  const list = (results.targets ?? []).filter((t) => typeof t.value === "number" && Number.isFinite(t.value));
  const peer = results.sections.peer?.ratios;
  const rows = list.map((t) => ({
    label: t.what,
    score: t.value / t.limit,
    value: t.unit === "x" ? `${num(t.value, 2)}×` : `${num(t.value, valueDigits(t))} ${t.unit}`,
    good: t.result === "PASS",
    higherIsBetter: t.cmp === ">=",
  }));
  for (const [name, r] of Object.entries(peer ?? {})) {
    if (typeof r.wall_p50 === "number")
      rows.push({
        label: `${name === "runner_exec" ? "webcodex-runner exec" : "webcodex run"} wall ÷ acpx exec wall`,
        score: r.wall_p50,
        value: `${num(r.wall_p50, 2)}×`,
        good: r.wall_p50 <= 1,
        higherIsBetter: false,
      });
  }
  if (rows.length === 0) return out + text(x0, y0 + 20, "no targets measured in this run");
  const labelW = 300;
  const maxScore = Math.max(2, ...rows.map((r) => Math.min(r.score, 4)));
  const scale = (w - labelW - 70) / maxScore;
  const rh = Math.min(34, h / rows.length);
  rows.forEach((r, i) => {
    const y = y0 + i * rh;
    out += text(x0, y + rh / 2 + 4, r.label.length > 48 ? `${r.label.slice(0, 47)}…` : r.label, { size: 11 });
    const bw = Math.max(1, Math.min(r.score, maxScore) * scale);
    out += `<rect x="${x0 + labelW}" y="${y + 4}" width="${bw}" height="${rh - 8}" rx="3" fill="${r.good ? "#4caf50" : "#e53935"}"/>`;
    out += text(x0 + labelW + bw + 6, y + rh / 2 + 4, `${r.value}${r.higherIsBetter ? " (≥)" : " (≤)"}`, { size: 11 });
  });
  const xl = x0 + labelW + scale;
  out += `<line x1="${xl}" y1="${y0 - 4}" x2="${xl}" y2="${y0 + rows.length * rh + 4}" stroke="#222" stroke-dasharray="4 3"/>`;
  out += text(xl, y0 + rows.length * rh + 18, "1.0 = target", { size: 11, anchor: "middle", fill: "#555" });
  return out;
}

export function svgOf(results) {
  const m = results.machine ?? {};
  const title = `WebCodex bench${results.quick ? " (--quick)" : ""} — ${m.cores ?? "?"} × ${m.cpu_model ?? "?"}, node ${m.node ?? "?"}, load ${(m.loadavg_at_start ?? []).map((v) => v.toFixed(1)).join("/")}, commit ${m.git_commit ?? "?"}, ${results.started_at ?? ""}`;
  return (
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">` +
    `<rect width="${W}" height="${H}" fill="#ffffff"/>` +
    text(20, 28, title, { size: 13, fill: "#444" }) +
    heatMap(results, 20, 80, 420, 440) +
    bars(results, 480, 80, 600, 440) +
    "</svg>"
  );
}

/** Writes `file` (PNG). Returns null, or why it could not (the library missing is not a harness crash). */
export async function writePicture(results, file) {
  let Resvg;
  try {
    ({ Resvg } = await import("@resvg/resvg-js"));
  } catch (error) {
    return `@resvg/resvg-js not installed (${String(error?.message ?? error).split("\n")[0]})`;
  }
  const { writeFileSync } = await import("node:fs");
  const png = new Resvg(svgOf(results), { font: { loadSystemFonts: true, defaultFontFamily: "DejaVu Sans" } })
    .render()
    .asPng();
  writeFileSync(file, png);
  return null;
}
