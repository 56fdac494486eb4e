/**
 * A small line chart of soak samples as SVG (one panel per metric, x = run
 * number), rendered to PNG by the headless Chromium the browser tests use
 * (playwright-core + the packaged Chromium of packages/server/test/support/browser.ts).
 */
import { chromium } from "playwright-core";
import { browserLaunchOptions } from "../../../../packages/server/test/support/browser.js";

export interface Series {
  label: string;
  unit: string;
  points: Array<[number, number]>;
}

const W = 900;
const PANEL_H = 160;
const PAD = { left: 70, right: 20, top: 28, bottom: 24 };
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;");

export function soakSvg(title: string, panels: Series[][]): string {
  const height = panels.length * PANEL_H + 40;
  let body = `<text x="${W / 2}" y="22" text-anchor="middle" font-size="16" font-family="sans-serif">${esc(title)}</text>`;
  panels.forEach((series, p) => {
    const top = 40 + p * PANEL_H;
    const all = series.flatMap((s) => s.points);
    const xMax = Math.max(1, ...all.map(([x]) => x));
    const yMax = Math.max(1, ...all.map(([, y]) => y)) * 1.1;
    const plotW = W - PAD.left - PAD.right;
    const plotH = PANEL_H - PAD.top - PAD.bottom;
    const sx = (x: number) => PAD.left + (x / xMax) * plotW;
    const sy = (y: number) => top + PAD.top + plotH - (y / yMax) * plotH;
    body += `<rect x="${PAD.left}" y="${top + PAD.top}" width="${plotW}" height="${plotH}" fill="none" stroke="#ccc"/>`;
    body += `<text x="${PAD.left - 6}" y="${top + PAD.top + 4}" text-anchor="end" font-size="11" font-family="sans-serif">${yMax.toFixed(yMax < 10 ? 1 : 0)}</text>`;
    body += `<text x="${PAD.left - 6}" y="${top + PAD.top + plotH}" text-anchor="end" font-size="11" font-family="sans-serif">0</text>`;
    body += `<text x="${PAD.left + plotW}" y="${top + PANEL_H - 6}" text-anchor="end" font-size="11" font-family="sans-serif">run ${xMax}</text>`;
    series.forEach((s, i) => {
      const color = COLORS[i % COLORS.length];
      const d = s.points.map(([x, y], k) => `${k === 0 ? "M" : "L"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ");
      body += `<path d="${d}" fill="none" stroke="${color}" stroke-width="1.5"/>`;
      body += `<text x="${PAD.left + 8 + i * 210}" y="${top + PAD.top - 8}" font-size="12" font-family="sans-serif" fill="${color}">${esc(`${s.label} (${s.unit})`)}</text>`;
    });
  });
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${height}" viewBox="0 0 ${W} ${height}"><rect width="100%" height="100%" fill="white"/>${body}</svg>`;
}

/** Renders `svg` to a PNG file with headless Chromium. */
export async function svgToPng(svg: string, file: string): Promise<void> {
  const browser = await chromium.launch(await browserLaunchOptions());
  try {
    const page = await browser.newPage();
    await page.setContent(`<!doctype html><html><body style="margin:0">${svg}</body></html>`);
    const el = await page.$("svg");
    if (!el) throw new Error("the chart SVG did not render");
    await el.screenshot({ path: file });
  } finally {
    await browser.close();
  }
}
