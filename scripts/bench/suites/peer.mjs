/**
 * Side by side with the closest peer: one one-shot prompt (`scenario: hello`,
 * the fake agent, the same project dir and env) as a whole process —
 *   acpx      `acpx --agent "<fake agent>" --format json exec PROMPT` (acpx on its Node 22)
 *   exec      `webcodex-runner exec --json` (the Runner alone, no Server)
 *   full      `webcodex run --json` against a warm Server + Runner (the CLI over MCP)
 * alternating run by run (A B C A B C …) so each sees the same machine load.
 *
 * Per run: wall time (spawn → exit), start-to-first-update (spawn → the first
 * stdout line carrying the agent's first chunk), start-to-dispatch (spawn →
 * the fake agent's ledger entry for that prompt), CPU of the process tree
 * (this process's cutime+cstime delta: the client and every descendant it
 * reaped, i.e. the agent too), and the tree's peak RSS (sum over the tree,
 * sampled every TREE_SAMPLE_MS). For `full` the warm daemons' CPU delta (the
 * Runner's includes its reaped agent) is reported as well and counted in
 * `cpu_total_ms`.
 */
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { LedgerReader } from "../lib/ledger.mjs";
import { FAKE_AGENT_BIN, REPO, RUNNER_BIN } from "../lib/paths.mjs";
import { ensurePeer } from "../lib/peer-install.mjs";
import { CLK_TCK, childrenOf, readProc } from "../lib/proc.mjs";
import { hrNow, ratio, summarize } from "../lib/stats.mjs";
import { makeTempDir } from "../lib/tmp.mjs";

const CLI_BIN = join(REPO, "packages/cli/bin/webcodex.js");
const TREE_SAMPLE_MS = 10;
/** Bound of one one-shot prompt (the hello scenario takes well under a second unloaded). */
const RUN_TIMEOUT_MS = 60_000;
/** The first word of the fake agent's greeting: every client prints it with the first update. */
const FIRST_CHUNK_MARKER = "Hello";

/** utime+stime+cutime+cstime of `pid` in ms. */
function treeCpuMs(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return {
      self: ((Number(rest[11]) + Number(rest[12])) * 1000) / CLK_TCK,
      children: ((Number(rest[13]) + Number(rest[14])) * 1000) / CLK_TCK,
    };
  } catch {
    return { self: 0, children: 0 };
  }
}

function treeRssKb(pid, depth = 0) {
  const p = readProc(pid);
  if (!p) return 0;
  let kb = p.rssKb;
  if (depth < 6) for (const c of childrenOf(pid)) kb += treeRssKb(c, depth + 1);
  return kb;
}

/** Runs argv once; resolves with its figures. The prompt must be in the ledger exactly once afterwards. */
async function measureOnce({ argv, env, cwd, ledger, prompt, daemons = {} }) {
  const before = treeCpuMs("self");
  const daemonBefore = Object.fromEntries(Object.entries(daemons).map(([k, pid]) => [k, treeCpuMs(pid)]));
  const t0 = hrNow();
  const child = spawn(argv[0], argv.slice(1), { cwd, env, stdio: ["ignore", "pipe", "pipe"] });
  let firstUpdate = null;
  let stderr = "";
  createInterface({ input: child.stdout }).on("line", (line) => {
    if (firstUpdate === null && line.includes(FIRST_CHUNK_MARKER)) firstUpdate = hrNow() - t0;
  });
  child.stderr.on("data", (d) => {
    if (stderr.length < 2000) stderr += d;
  });
  let peakKb = 0;
  const timer = setInterval(() => {
    peakKb = Math.max(peakKb, treeRssKb(child.pid));
  }, TREE_SAMPLE_MS);
  const killer = setTimeout(() => child.kill("SIGKILL"), RUN_TIMEOUT_MS);
  const code = await new Promise((resolve) => child.once("close", (c) => resolve(c)));
  const wall = hrNow() - t0;
  clearInterval(timer);
  clearTimeout(killer);
  const after = treeCpuMs("self");
  const entry = await ledger.waitFor(prompt, 5000).catch(() => null);
  const out = {
    exit_code: code,
    wall_ms: wall,
    first_update_ms: firstUpdate,
    dispatch_ms: entry ? entry.hr_ms - t0 : null,
    dispatches: ledger.entries(prompt).length,
    cpu_ms: after.children - before.children,
    peak_rss_mb: peakKb / 1024,
  };
  if (Object.keys(daemons).length) {
    out.daemon_cpu_ms = {};
    for (const [k, pid] of Object.entries(daemons)) {
      const a = treeCpuMs(pid);
      const b = daemonBefore[k];
      out.daemon_cpu_ms[k] = a.self + a.children - (b.self + b.children);
    }
    out.cpu_total_ms = out.cpu_ms + Object.values(out.daemon_cpu_ms).reduce((s, v) => s + v, 0);
  } else out.cpu_total_ms = out.cpu_ms;
  if (code !== 0) out.error = `exit ${code}: ${stderr.trim().split("\n").slice(-2).join(" ").slice(0, 300)}`;
  return out;
}

function summary(list) {
  const ok = list.filter((r) => !r.error);
  const pick = (k) => summarize(ok.map((r) => r[k]).filter((v) => typeof v === "number"));
  return {
    runs: list.length,
    failures: list.length - ok.length,
    first_error: list.find((r) => r.error)?.error ?? null,
    duplicate_dispatches: list.filter((r) => r.dispatches > 1).length,
    wall_ms: pick("wall_ms"),
    first_update_ms: pick("first_update_ms"),
    dispatch_ms: pick("dispatch_ms"),
    cpu_ms: pick("cpu_ms"),
    cpu_total_ms: pick("cpu_total_ms"),
    peak_rss_mb: pick("peak_rss_mb"),
    ...(ok[0]?.daemon_cpu_ms
      ? {
          daemon_cpu_ms: Object.fromEntries(
            Object.keys(ok[0].daemon_cpu_ms).map((k) => [k, summarize(ok.map((r) => r.daemon_cpu_ms[k]))]),
          ),
        }
      : {}),
  };
}

/**
 * @param ctx bench context (log)
 * @param o.runs alternations
 * @param o.stack a warm full stack (stack.mjs) or null (then `full` is not measured)
 */
export async function measure(ctx, { runs, stack }) {
  const peer = ensurePeer(ctx.log);
  if (peer.skipped) {
    ctx.log(`peer: SKIPPED — ${peer.skipped}`);
    return { skipped: peer.skipped };
  }
  const dir = makeTempDir("peer");
  const project = join(dir, "project");
  const home = join(dir, "home");
  mkdirSync(project);
  mkdirSync(home);
  const ledgerFile = join(dir, "ledger.jsonl");
  const ledger = new LedgerReader(ledgerFile);
  const env = { PATH: process.env.PATH ?? "", HOME: home };
  // The Runner's exec reads the stack's runner.toml (a throwaway store; the daemon's state dir is untouched)
  // but its agent must write this suite's ledger: a config of its own, same agent otherwise.
  const runnerConfig = join(dir, "runner.toml");
  const toml = (v) => JSON.stringify(v);
  writeFileSync(
    runnerConfig,
    `[runner]\nstate_dir = "runner-state"\nlog_level = "info"\n\n[[projects]]\nid = "bench"\nroot = ${toml(project)}\nallow_patch = true\n\n` +
      `[acp]\nagents_share_runner_user = true\nmax_concurrent_runs = 4\nsetup_timeout_secs = 30\ncancel_grace_secs = 5\n\n` +
      `[[acp.agents]]\nid = "fake"\nname = "fake"\nexecutable = ${toml(process.execPath)}\nargs = ${toml([FAKE_AGENT_BIN, "--ledger", ledgerFile])}\n` +
      `[acp.agents.env_from_env]\nPATH = "PATH"\nHOME = "HOME"\n`,
  );
  const agentCommand = [process.execPath, FAKE_AGENT_BIN, "--ledger", ledgerFile].join(" ");
  const contenders = {
    acpx: (prompt) => ({
      argv: [
        peer.node,
        peer.script,
        "--agent",
        agentCommand,
        "--cwd",
        project,
        "--approve-all",
        "--format",
        "json",
        "exec",
        prompt,
      ],
      env,
      cwd: dir,
      ledger,
    }),
    runner_exec: (prompt) => ({
      argv: [
        process.execPath,
        RUNNER_BIN,
        "exec",
        "--config",
        runnerConfig,
        "--project",
        "bench",
        "--provider",
        "fake",
        "--json",
        prompt,
      ],
      env,
      cwd: dir,
      ledger,
    }),
  };
  if (stack) {
    contenders.full_stack = (prompt) => ({
      argv: [
        process.execPath,
        CLI_BIN,
        "run",
        "--url",
        stack.url,
        "--project",
        stack.projectId,
        "--provider",
        stack.providerId,
        "--json",
        prompt,
      ],
      env: { ...env, WEBCODEX_TOKEN: stack.tokens[0] },
      cwd: dir,
      ledger: stack.ledger,
      daemons: stack.pids(),
    });
  }
  const raw = Object.fromEntries(Object.keys(contenders).map((k) => [k, []]));
  // One untimed warm-up each (disk cache, the warm stack's first run).
  for (const [name, make] of Object.entries(contenders)) {
    const prompt = `scenario: hello\nbench-nonce ${randomUUID()}`;
    const r = await measureOnce({ ...make(prompt), prompt });
    if (r.error) ctx.log(`peer: warm-up ${name}: ${r.error}`);
  }
  for (let i = 0; i < runs; i++) {
    for (const [name, make] of Object.entries(contenders)) {
      const prompt = `scenario: hello\nbench-nonce ${randomUUID()}`;
      raw[name].push(await measureOnce({ ...make(prompt), prompt }));
    }
  }
  const out = {
    peer: { acpx: peer.acpx_version, node: peer.node_version, source: peer.source },
    runs,
    contenders: Object.fromEntries(Object.entries(raw).map(([k, v]) => [k, summary(v)])),
  };
  const a = out.contenders.acpx;
  out.ratios = {};
  for (const name of ["runner_exec", "full_stack"]) {
    const c = out.contenders[name];
    if (!c) continue;
    out.ratios[name] = {
      wall_p50: ratio(c.wall_ms.p50, a.wall_ms.p50),
      first_update_p50: ratio(c.first_update_ms.p50, a.first_update_ms.p50),
      dispatch_p50: ratio(c.dispatch_ms.p50, a.dispatch_ms.p50),
      cpu_p50: ratio(c.cpu_ms.p50, a.cpu_ms.p50),
      cpu_total_p50: ratio(c.cpu_total_ms.p50, a.cpu_total_ms.p50),
      peak_rss_p50: ratio(c.peak_rss_mb.p50, a.peak_rss_mb.p50),
    };
  }
  return out;
}
