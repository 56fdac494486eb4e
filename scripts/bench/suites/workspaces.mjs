/**
 * Workspaces (issue 41 §4, design §16): what a checkout of its own costs a run's start, and what reading back a
 * large change costs.
 *
 * - start-to-dispatch (the `start` suite's `oursOnce`) on one stack whose Runner has three projects on generated
 *   git repositories (lib/git-repo.mjs, made in the bench's temp dir, one commit each): `ws-shared` (shared mode,
 *   files[0] files), `ws-small` (worktree mode, files[0]) and `ws-large` (worktree mode, files[1]). Each round
 *   runs one start on each (the large one only in the first `largeRuns` rounds), the order rotated every round,
 *   so all see the same machine load. The Runner keeps no worktree after its change is recorded
 *   (`workspace_keep_secs = 0`): each ended run's worktree is removed before its terminal is reported, so no
 *   sweep overlaps a later start and the temp dir holds at most one checkout per project at a time.
 * - changes: a worktree run on `ws-small` whose agent writes `changeFiles` new files (`scenario: edit_files`);
 *   once it has ended, every page of `get_coding_agent_changes` (the default page size), timed; the baseline is
 *   git itself on the same repository and commits, the two commands the answer needs at least
 *   (`git diff --numstat` and `git diff`), run by the bench. Repeated `changeReps` times.
 */
import { join } from "node:path";
import { generateRepo, git } from "../lib/git-repo.mjs";
import { runnerRunTimings } from "../lib/runner-timings.mjs";
import { hrNow, ratio, summarize } from "../lib/stats.mjs";
import { makeTempDir } from "../lib/tmp.mjs";
import { launchStack } from "../stack.mjs";
import { agentGone, oursOnce } from "./start-dispatch.mjs";

/** Most pages the bench reads of one change before it gives up (a 1,000-file change is a handful). */
const MAX_CHANGE_PAGES = 1_000;
/** How long one edit_files run may take to end (writing the files, then the Runner recording them). */
const CHANGE_RUN_TIMEOUT_MS = 120_000;
/**
 * How long one start may take to reach its agent, and then to end: a worktree of 10,000 files is checked out
 * before the agent starts, and recorded and removed before the end, on a machine that may be loaded.
 */
const WORKTREE_RUN_TIMEOUT_MS = 120_000;

const PROJECTS = { shared: "ws-shared", small: "ws-small", large: "ws-large" };

export async function run(ctx, { files, runs, largeRuns, changeFiles, changeReps, nodeArgs = {} }) {
  const [smallFiles, largeFiles] = files;
  const gen = makeTempDir("workspaces-repos");
  const repos = {
    shared: await generateRepo(join(gen, "shared"), smallFiles),
    small: await generateRepo(join(gen, "small"), smallFiles),
    large: await generateRepo(join(gen, "large"), largeFiles),
  };
  ctx.log(
    `workspaces: repositories of ${smallFiles}/${largeFiles} files made in ${Object.values(repos)
      .map((r) => r.ms.toFixed(0))
      .join("/")} ms`,
  );
  const stack = await launchStack({
    label: "workspaces",
    nodeArgs,
    runnerSettings: "workspace_keep_secs = 0",
    extraProjects: [
      { id: PROJECTS.shared, root: join(gen, "shared"), workspace: "shared" },
      { id: PROJECTS.small, root: join(gen, "small"), workspace: "worktree" },
      { id: PROJECTS.large, root: join(gen, "large"), workspace: "worktree" },
    ],
  });
  const mcp = await stack.mcpClient();
  try {
    const start = await startToDispatch(ctx, { stack, mcp, runs, largeRuns });
    let changes;
    try {
      changes = await changesCost(ctx, { stack, mcp, repo: join(gen, "small"), changeFiles, changeReps });
    } catch (error) {
      changes = { error: String(error?.message ?? error) };
    }
    return {
      files: { small: smallFiles, large: largeFiles },
      repo_generation_ms: Object.fromEntries(Object.entries(repos).map(([k, r]) => [k, r.ms])),
      ...start,
      changes,
    };
  } finally {
    await mcp.close();
    await stack.stop();
  }
}

async function startToDispatch(ctx, { stack, mcp, runs, largeRuns }) {
  const samples = { shared: [], small: [], large: [] };
  const runIds = { shared: [], small: [], large: [] };
  const failures = [];
  let duplicates = 0;
  const deadline = Date.now() + ctx.budgetMs(600_000);
  for (let i = 0; i < runs && Date.now() < deadline; i++) {
    const sides = i < largeRuns ? ["shared", "small", "large"] : ["shared", "small"];
    // Rotate the order so no project always runs right after another's teardown.
    const order = sides.map((_, k) => sides[(k + i) % sides.length]);
    for (const side of order) {
      let r;
      try {
        r = await oursOnce(stack, mcp, { projectId: PROJECTS[side], timeoutMs: WORKTREE_RUN_TIMEOUT_MS });
      } catch (error) {
        r = { error: String(error?.message ?? error).split("\n")[0] };
      }
      if (r.error) {
        failures.push({ side, error: r.error });
        continue;
      }
      samples[side].push(r.ms);
      runIds[side].push([r.run_id, r.ms]);
      if (r.state !== "completed") failures.push({ side, run_id: r.run_id, state: r.state });
      if (r.dispatches !== 1) duplicates++;
    }
  }
  // Where the time goes: the Runner's own stages per run (spawn … prompt write; in worktree mode the worktree is
  // made inside the first), and everything before them (admission, the Server's hops) = the rest.
  const timings = runnerRunTimings(join(stack.dir, "runner.log"));
  const stagesOf = (k) => {
    const per = {};
    const before = [];
    for (const [id, ms] of runIds[k]) {
      const t = timings.get(id);
      if (!t) continue;
      let sum = 0;
      for (const [stage, v] of Object.entries(t)) {
        if (typeof v !== "number") continue;
        if (!per[stage]) per[stage] = [];
        per[stage].push(v);
        sum += v;
      }
      before.push(ms - sum);
    }
    return {
      before_runner_stages_ms: summarize(before),
      ...Object.fromEntries(Object.entries(per).map(([stage, v]) => [stage, summarize(v)])),
    };
  };
  const side = (k) => ({
    runs: samples[k].length,
    latency_ms: summarize(samples[k]),
    stages_ms: stagesOf(k),
    samples_ms: samples[k],
  });
  const out = { shared: side("shared"), worktree_small: side("small"), worktree_large: side("large") };
  return {
    ...out,
    small_p50_ratio: ratio(out.worktree_small.latency_ms.p50, out.shared.latency_ms.p50),
    small_p95_ratio: ratio(out.worktree_small.latency_ms.p95, out.shared.latency_ms.p95),
    large_p50_ratio: ratio(out.worktree_large.latency_ms.p50, out.shared.latency_ms.p50),
    large_p95_ratio: ratio(out.worktree_large.latency_ms.p95, out.shared.latency_ms.p95),
    failures: failures.slice(0, 5),
    failure_count: failures.length,
    duplicate_dispatches: duplicates,
  };
}

/** One worktree run writing `changeFiles` files, to its end (its change recorded). */
async function changeRun(stack, mcp, changeFiles) {
  const prompt = `scenario: edit_files dir=bench-change count=${changeFiles}\nbench-nonce ${hrNow()}`;
  const started = await mcp.start({ provider_id: stack.providerId, project_id: PROJECTS.small, prompt });
  if (!started.ok) throw new Error(`start_coding_agent: ${JSON.stringify(started.error)}`);
  const final = await mcp.observeToEnd(started.value.run_id, started.value.observation_token, CHANGE_RUN_TIMEOUT_MS);
  if (final.state !== "completed") throw new Error(`edit_files run ended ${final.state}`);
  const ws = final.workspace ?? {};
  if (!ws.head_commit) throw new Error("edit_files run ended without a recorded change");
  // Its agent gone too, so the reads below share the CPU with nothing of this run.
  await agentGone(stack.ledger.entries(prompt)[0]?.pid);
  return { runId: started.value.run_id, base: ws.base_commit, head: ws.head_commit };
}

/**
 * Every page of get_coding_agent_changes for `runId`: ms to the first page and to the last, and what came
 * (`files`: the distinct paths listed over all pages; each page may list them again).
 */
async function readChanges(mcp, runId) {
  const t0 = performance.now();
  let firstMs = null;
  let cursor;
  let pages = 0;
  const paths = new Set();
  let diffBytes = 0;
  let filesTruncated = false;
  for (; pages < MAX_CHANGE_PAGES; ) {
    const r = await mcp.changes(runId, cursor);
    if (!r.ok) throw new Error(`get_coding_agent_changes: ${JSON.stringify(r.error).slice(0, 300)}`);
    pages++;
    firstMs ??= performance.now() - t0;
    for (const f of r.value.files ?? []) paths.add(f.path);
    diffBytes += Buffer.byteLength(r.value.diff ?? "");
    filesTruncated ||= r.value.files_truncated === true;
    cursor = r.value.next_cursor;
    if (cursor === undefined) break;
  }
  return {
    first_ms: firstMs,
    all_ms: performance.now() - t0,
    pages,
    files: paths.size,
    diff_bytes: diffBytes,
    filesTruncated,
  };
}

/** The baseline: git's own numstat and diff of the same two commits, in the project's repository. */
async function bareGit(repo, base, head) {
  const t0 = performance.now();
  const numstat = await git(repo, ["diff", "--numstat", "-z", base, head]);
  const diff = await git(repo, ["diff", base, head]);
  return { ms: performance.now() - t0, diff_bytes: Buffer.byteLength(diff), numstat_bytes: Buffer.byteLength(numstat) };
}

async function changesCost(ctx, { stack, mcp, repo, changeFiles, changeReps }) {
  const ours = { first: [], all: [] };
  const bare = [];
  let last = null;
  const deadline = Date.now() + ctx.budgetMs(300_000);
  for (let i = 0; i < changeReps && Date.now() < deadline; i++) {
    const change = await changeRun(stack, mcp, changeFiles);
    // Alternate which side reads first, so neither always meets a warm page cache.
    let b;
    let o;
    if (i % 2 === 0) {
      b = await bareGit(repo, change.base, change.head);
      o = await readChanges(mcp, change.runId);
    } else {
      o = await readChanges(mcp, change.runId);
      b = await bareGit(repo, change.base, change.head);
    }
    bare.push(b.ms);
    ours.first.push(o.first_ms);
    ours.all.push(o.all_ms);
    last = { ours: o, bare: b };
  }
  const all = summarize(ours.all);
  const git_ms = summarize(bare);
  return {
    change_files: changeFiles,
    reps: bare.length,
    ours_first_page_ms: summarize(ours.first),
    ours_all_pages_ms: all,
    bare_git_ms: git_ms,
    p50_ratio: ratio(all.p50, git_ms.p50),
    pages: last?.ours.pages ?? null,
    files_listed: last?.ours.files ?? null,
    files_truncated: last?.ours.filesTruncated ?? null,
    diff_bytes: last?.ours.diff_bytes ?? null,
    bare_diff_bytes: last?.bare.diff_bytes ?? null,
  };
}
