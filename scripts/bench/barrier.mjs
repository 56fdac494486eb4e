/**
 * Cost of the prompt-dispatch barrier (issue 4): the durable commit the
 * Runner makes immediately before writing session/prompt, measured through
 * the real store (SqliteDispatchStore.markDispatchBarrier: WAL +
 * synchronous=FULL, fsync'd before it returns), next to the very same UPDATE
 * on an identical database with synchronous=OFF (no fsync; not durable).
 *
 *   node scripts/bench/barrier.mjs [--quick]     prints a table
 *   import { run } from "./barrier.mjs"; await run({ quick })   → JSON-able result
 *
 * Needs the built runner (tsc -b).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import Database from "better-sqlite3";

const REPO = resolve(fileURLToPath(new URL("../..", import.meta.url)));
const STORE_MODULE = join(REPO, "packages/runner/dist/store/dispatch-store.js");

function percentile(sorted, p) {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))];
}

function summarize(samples) {
  const sorted = [...samples].sort((a, b) => a - b);
  const sum = sorted.reduce((a, b) => a + b, 0);
  return {
    n: sorted.length,
    median_ms: percentile(sorted, 50),
    p99_ms: percentile(sorted, 99),
    mean_ms: sorted.length ? sum / sorted.length : Number.NaN,
    max_ms: sorted.length ? sorted[sorted.length - 1] : Number.NaN,
  };
}

function runId(i) {
  const alphabet = "abcdefghijklmnopqrstuvwxyz234567";
  let s = "";
  let n = i;
  for (let k = 0; k < 26; k++) {
    s += alphabet[n % 32];
    n = Math.floor(n / 32);
  }
  return `wc_agent_run_${s}`;
}

function admission(i) {
  return {
    run_id: runId(i),
    intent_fingerprint: "0".repeat(64),
    project_id: "bench",
    provider_id: "fake",
    provider_instance_id: "bench_provider_instance",
    agent_instance_id: "bench_agent_instance_id",
    created_at: new Date().toISOString(),
  };
}

const BARRIER_SQL = `UPDATE runs SET phase = 'dispatch_barrier', state = 'running', execution_state = 'started',
  updated_at = ? WHERE run_id = ? AND phase IN ('admitted', 'setup')`;

export async function run({ quick = false } = {}) {
  const commits = quick ? 200 : 1000;
  const { SqliteDispatchStore } = await import(pathToFileURL(STORE_MODULE).href);
  const dir = mkdtempSync(join(tmpdir(), "webcodex-bench-barrier-"));
  try {
    // Durable: the real store API.
    const durable = SqliteDispatchStore.openFile(join(dir, "durable.sqlite"), { create: true });
    const durableSamples = [];
    try {
      for (let i = 0; i < commits; i++) durable.admit(admission(i));
      for (let i = 0; i < commits; i++) {
        const t0 = performance.now();
        durable.markDispatchBarrier(runId(i));
        durableSamples.push(performance.now() - t0);
      }
    } finally {
      durable.close();
    }

    // Non-durable: identical schema and rows, same UPDATE, synchronous=OFF.
    SqliteDispatchStore.openFile(join(dir, "plain.sqlite"), { create: true }).close();
    const plainStore = SqliteDispatchStore.openFile(join(dir, "plain.sqlite"), { create: false });
    for (let i = 0; i < commits; i++) plainStore.admit(admission(i));
    plainStore.close();
    const db = new Database(join(dir, "plain.sqlite"));
    const plainSamples = [];
    try {
      db.pragma("journal_mode = WAL");
      db.pragma("synchronous = OFF");
      const update = db.prepare(BARRIER_SQL);
      for (let i = 0; i < commits; i++) {
        const t0 = performance.now();
        update.run(new Date().toISOString(), runId(i));
        plainSamples.push(performance.now() - t0);
      }
    } finally {
      db.close();
    }

    const barrier = summarize(durableSamples);
    const plain = summarize(plainSamples);
    return {
      suite: "barrier",
      commits,
      tmpdir: tmpdir(),
      durable_barrier: { ...barrier, pragmas: "journal_mode=WAL, synchronous=FULL" },
      non_durable_write: { ...plain, pragmas: "journal_mode=WAL, synchronous=OFF" },
      median_overhead_ms: barrier.median_ms - plain.median_ms,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function fmt(v) {
  return Number.isFinite(v) ? v.toFixed(3) : "n/a";
}

export function printTable(result) {
  const rows = [
    ["barrier commit (FULL, fsync)", result.durable_barrier],
    ["same UPDATE (synchronous=OFF)", result.non_durable_write],
  ];
  const lines = [
    `barrier cost over ${result.commits} commits (temp dir ${result.tmpdir})`,
    `${"write".padEnd(32)}${"median ms".padStart(12)}${"p99 ms".padStart(12)}${"max ms".padStart(12)}`,
    ...rows.map(
      ([name, s]) =>
        `${name.padEnd(32)}${fmt(s.median_ms).padStart(12)}${fmt(s.p99_ms).padStart(12)}${fmt(s.max_ms).padStart(12)}`,
    ),
  ];
  return lines.join("\n");
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  const result = await run({ quick: process.argv.includes("--quick") });
  process.stdout.write(`${printTable(result)}\n`);
}
