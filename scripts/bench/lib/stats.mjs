/** Small, dependency-free statistics for latency samples (milliseconds). */

/** Nearest-rank percentile of an ascending-sorted array; NaN when empty. */
export function percentile(sorted, p) {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))];
}

/** count, min, mean, p50, p95, p99, max of `samples` (numbers; non-finite values are dropped). */
export function summarize(samples) {
  const sorted = samples.filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
  const n = sorted.length;
  const sum = sorted.reduce((a, b) => a + b, 0);
  return {
    n,
    min: n ? sorted[0] : Number.NaN,
    mean: n ? sum / n : Number.NaN,
    p50: percentile(sorted, 50),
    p95: percentile(sorted, 95),
    p99: percentile(sorted, 99),
    max: n ? sorted[n - 1] : Number.NaN,
  };
}

/** a / b, or null when either side is missing or b is zero. */
export function ratio(a, b) {
  if (!Number.isFinite(a) || !Number.isFinite(b) || b === 0) return null;
  return a / b;
}

/** Rounds numbers in a JSON-able value for the results file (keeps 3 decimals). */
export function round(value, digits = 3) {
  if (typeof value === "number") {
    if (!Number.isFinite(value)) return null;
    const f = 10 ** digits;
    return Math.round(value * f) / f;
  }
  if (Array.isArray(value)) return value.map((v) => round(v, digits));
  if (value && typeof value === "object") {
    const out = {};
    for (const [k, v] of Object.entries(value)) out[k] = round(v, digits);
    return out;
  }
  return value;
}

/** High-resolution wall-clock milliseconds, comparable across processes on one machine. */
export function hrNow() {
  return performance.timeOrigin + performance.now();
}
