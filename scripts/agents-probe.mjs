#!/usr/bin/env node
/**
 * `npm run probe:agents` — opt-in, not part of `npm test` (it installs ~2 GB of agents): installs each
 * pinned ACP agent of docs/agents/ (scripts/agents-lib.mjs) into `.agents-cache/` with the shared pinned
 * installer (no install scripts run), then checks each offline with the Runner's own probe (the code
 * behind `webcodex-runner check --probe`): spawn as a run would (cleared env, own process group, cwd =
 * a temp project), `initialize`, `session/new`, the guide's forced config applied and verified, the
 * verdict. What each advertised is written to `.agents-cache/capabilities.actual.json` and compared
 * with the committed docs/agents/capabilities.json; any difference is printed and the exit is 1, so a
 * version bump that changes an agent's surface is seen. `--update` rewrites the committed snapshot.
 *
 *   node scripts/agents-probe.mjs [--only id,id] [--update]
 *
 * No account is used: where an agent only checks that a key is present, the probe gives it a
 * placeholder; an agent that checks its login online answers session/new with auth_required, which is
 * its recorded status. An agent that cannot be installed from the registry alone is recorded as
 * `not_installable` (a verdict, not a failure of this script). Nothing the agents say is printed but
 * ids, versions and the verdict.
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, dirname, join } from "node:path";
import { AGENTS, cacheDirOf, diffSnapshots, formatDiff, NODE22, snapshotEntry, sortKeys } from "./agents-lib.mjs";
import { ROOT } from "./local-stack.mjs";
import { installedVersion, installPinned } from "./pinned-install.mjs";

/** Bound of one agent's initialize + session/new + forced config (big CLIs, a loaded machine). */
const PROBE_TIMEOUT_SECS = 120;
const CACHE_ROOT = join(ROOT, ".agents-cache");
const SNAPSHOT = join(ROOT, "docs", "agents", "capabilities.json");
const ACTUAL = join(CACHE_ROOT, "capabilities.actual.json");

const say = (line = "") => process.stdout.write(`${line}\n`);
const args = process.argv.slice(2);
const update = args.includes("--update");
const onlyAt = args.indexOf("--only");
const only = onlyAt >= 0 ? (args[onlyAt + 1] ?? "").split(",").filter(Boolean) : null;
const unknown = (only ?? []).filter((id) => !AGENTS.some((a) => a.id === id));
if (unknown.length > 0) {
  say(`--only: unknown agent ${unknown.join(", ")} (known: ${AGENTS.map((a) => a.id).join(", ")})`);
  process.exit(2);
}
const agents = AGENTS.filter((a) => only === null || only.includes(a.id));

/** Node 22 from the cache (installed once, its install script approved: it fetches the binary from npm). */
function ensureNode22() {
  const dir = join(CACHE_ROOT, `node-${NODE22.version}`);
  const node = join(dir, "node_modules", "node", "bin", "node");
  if (!existsSync(node)) {
    say(`installing node@${NODE22.version} into ${dir} …`);
    const r = installPinned(dir, [`node@${NODE22.version}`], { approveScripts: ["node"] });
    if (!r.ok || !existsSync(node)) return { why: `node@${NODE22.version} did not install: ${r.why}` };
  }
  return { node };
}

/** Install one agent (no install scripts), then find its entry: `{ executable, args, pathDirs }` or `{ why }`. */
function ensureAgent(agent, node22) {
  const dir = cacheDirOf(CACHE_ROOT, agent);
  if (installedVersion(dir, agent.pkg) !== agent.version) {
    say(`installing ${agent.pkg}@${agent.version} into ${dir} …`);
    const r = installPinned(dir, [`${agent.pkg}@${agent.version}`, ...(agent.extra ?? [])], { ignoreScripts: true });
    if (!r.ok) return { why: `npm install failed: ${r.why}` };
  }
  const modules = join(dir, "node_modules");
  const entry = agent.entry(modules);
  const file = entry.executable ?? entry.script;
  if (!existsSync(file)) {
    return {
      why: `the registry install has no ${file.slice(modules.length + 1)} for ${process.platform}-${process.arch}`,
    };
  }
  let node = process.execPath;
  if (agent.node === 22) {
    if (node22.why) return { why: node22.why };
    node = node22.node;
  }
  const executable = entry.executable ?? node;
  const argv = entry.executable ? entry.args : [entry.script, ...entry.args];
  const pathDirs = [dirname(node), ...(agent.pathDirs?.(modules) ?? []), "/usr/local/bin", "/usr/bin", "/bin"];
  return { executable, args: argv, pathDirs };
}

const toml = (v) => JSON.stringify(v);

/** One Runner config with an [[acp.agents]] entry per installed agent; env comes from WC_AGENTS_<ID>_<NAME>. */
function runnerConfig(work, installed) {
  const sourceEnv = {};
  let text = `[runner]\nstate_dir = "state"\n\n[[projects]]\nid = "probe"\nroot = ${toml(join(work, "project"))}\nallow_patch = true\n\n[acp]\nagents_share_runner_user = true\nsetup_timeout_secs = ${PROBE_TIMEOUT_SECS}\n`;
  for (const { agent, entry } of installed) {
    const home = join(work, "homes", agent.id);
    mkdirSync(home, { recursive: true });
    const env = { PATH: entry.pathDirs.join(delimiter), HOME: home, ...agent.env };
    text += `\n[[acp.agents]]\nid = ${toml(agent.id)}\nexecutable = ${toml(entry.executable)}\nargs = ${toml(entry.args)}\nallowed_config_options = []\n[acp.agents.forced_config]\n`;
    for (const [k, v] of Object.entries(agent.forced)) text += `${k} = ${toml(v)}\n`;
    text += "[acp.agents.env_from_env]\n";
    for (const [name, value] of Object.entries(env)) {
      const source = `WC_AGENTS_${agent.id.toUpperCase()}_${name}`;
      sourceEnv[source] = value;
      text += `${name} = ${toml(source)}\n`;
    }
  }
  return { text, sourceEnv };
}

async function main() {
  const runner = join(ROOT, "packages", "runner", "dist", "index.js");
  if (!existsSync(runner)) throw new Error("the packages are not built; run `npm run probe:agents` (it builds first)");
  const { parseConfig, probeAgent, probeVerdict } = await import(runner);
  mkdirSync(CACHE_ROOT, { recursive: true });
  const node22 = agents.some((a) => a.node === 22) ? ensureNode22() : {};
  const outcomes = {};
  const installed = [];
  for (const agent of agents) {
    const entry = ensureAgent(agent, node22);
    if (entry.why) outcomes[agent.id] = { status: "not_installable", why: entry.why };
    else installed.push({ agent, entry });
  }
  const work = mkdtempSync(join(tmpdir(), "webcodex-agents-probe-"));
  try {
    mkdirSync(join(work, "project"));
    const { text, sourceEnv } = runnerConfig(work, installed);
    const file = join(work, "runner.toml");
    writeFileSync(file, text, { mode: 0o600 });
    const config = parseConfig(text, file);
    for (const { agent } of installed) {
      const cfg = config.acp.agents.find((a) => a.id === agent.id);
      say(`probing ${agent.id} (${agent.pkg}@${agent.version}) …`);
      const probe = await probeAgent({
        agent: cfg,
        project: config.projects[0],
        timeoutSecs: PROBE_TIMEOUT_SECS,
        sourceEnv,
      });
      const verdict = probe.ok ? probeVerdict({ agent: cfg, ...probe }) : null;
      outcomes[agent.id] = { status: "probed", probe, verdict };
    }
  } finally {
    rmSync(work, { recursive: true, force: true });
  }

  const actual = {};
  for (const agent of agents) actual[agent.id] = sortKeys(snapshotEntry(agent, outcomes[agent.id]));
  writeFileSync(ACTUAL, `${JSON.stringify(actual, null, 2)}\n`);
  for (const agent of agents) {
    const e = actual[agent.id];
    const detail =
      e.status === "ok"
        ? `verdict: ${e.verdict.mode}, ${e.verdict.warnings.length} warning(s)`
        : (e.why ?? e.stage ?? "");
    say(
      `  ${agent.id.padEnd(9)} ${`${agent.pkg}@${agent.version}`.padEnd(46)} ${e.status}${detail ? ` — ${detail}` : ""}`,
    );
  }

  const expected = existsSync(SNAPSHOT) ? JSON.parse(readFileSync(SNAPSHOT, "utf8")) : {};
  if (update) {
    const merged = sortKeys({ ...expected, ...actual });
    mkdirSync(dirname(SNAPSHOT), { recursive: true });
    writeFileSync(SNAPSHOT, `${JSON.stringify(merged, null, 2)}\n`);
    say(`wrote ${SNAPSHOT.slice(ROOT.length + 1)} (${agents.length} agent(s))`);
    return;
  }
  const diffs = diffSnapshots(
    expected,
    actual,
    agents.map((a) => a.id),
  );
  if (diffs.length === 0) {
    say(`probe:agents: ${agents.length} agent(s) match docs/agents/capabilities.json`);
    return;
  }
  say(
    `probe:agents: ${diffs.length} difference(s) from docs/agents/capabilities.json (this probe: ${ACTUAL.slice(ROOT.length + 1)}):`,
  );
  say(formatDiff(diffs));
  say("If the change is expected (a version bump), update the guides and run with --update.");
  process.exitCode = 1;
}

main().catch((err) => {
  say(`probe:agents failed: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
});
