/**
 * The simulated Runners (sim-runners.mjs) as a child process of the bench: the spec written into the stack's
 * temp dir, the child started, and its `ready` line awaited. Shared by the fan-out, cluster fan-out and
 * links suites.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { spawnJsonChild } from "./child.mjs";
import { BENCH_DIR } from "./paths.mjs";
import { stopTracked } from "./proc.mjs";

/** How long the sim process may take to have every hello acknowledged, unless the caller says otherwise. */
export const SIMS_READY_TIMEOUT_MS = 30_000;

/** `--cpu-prof` for a load-generator child, next to the Server's profiles (when the bench runs with --profile). */
export function profileArgs(nodeArgs, name) {
  const prof = nodeArgs?.server?.find((a) => a.startsWith("--cpu-prof-dir="));
  return prof ? ["--cpu-prof", prof.replace(/server$/, name)] : [];
}

/**
 * Starts `runners` (entries of `stack.sims`, each optionally with its own `url`) in one sim-runners.mjs
 * process and waits until every hello is acknowledged. Resolves to the child handle plus `ready` (its
 * ready line: hello_ms, elapsed_ms, acked_per_s, rss_mb); throws (after stopping the child) when a hello
 * failed or the bound passed. The caller stops it with `stopTracked(sims, …)`.
 */
export async function startSims(
  stack,
  { name, runners, intervalMs, maxDurationMs, connectConcurrency, nodeArgs, readyTimeoutMs = SIMS_READY_TIMEOUT_MS },
) {
  const specFile = join(stack.dir, `sims-${name}.json`);
  writeFileSync(
    specFile,
    JSON.stringify({
      url: stack.runnerUrl,
      interval_ms: intervalMs,
      max_duration_ms: maxDurationMs,
      ...(connectConcurrency ? { connect_concurrency: connectConcurrency } : {}),
      runners,
    }),
  );
  const sims = spawnJsonChild(join(BENCH_DIR, "sim-runners.mjs"), [specFile], {
    logFile: join(stack.dir, `sims-${name}.log`),
    nodeArgs: profileArgs(nodeArgs, "sim-runners"),
  });
  try {
    const ready = await sims.waitLine((l) => "ready" in l, readyTimeoutMs);
    if (!ready.ready) throw new Error(`sim runners failed: ${ready.error}`);
    return { ...sims, ready };
  } catch (error) {
    await stopTracked(sims, 2000);
    throw error;
  }
}
