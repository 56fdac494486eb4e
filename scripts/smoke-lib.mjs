/**
 * What the opt-in real-adapter smokes (smoke-codex.mjs, smoke-claude.mjs)
 * share: the pinned adapter (installed into .smoke-cache/ or given by
 * <PREFIX>_SCRIPT + <PREFIX>_NODE) and its package check, the throwaway Git
 * projects with fixed acceptance tests, the local Server + Runner stack, one
 * run through the real MCP client, the checks of each case, and the report.
 * Provider messages and raw diagnostics are never printed: only states,
 * kinds and counts. Every process is drained, pass or fail.
 */
import { execFileSync, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import {
  BINS,
  descendants,
  issuePrincipalToken,
  newRunnerToken,
  ROOT,
  serverConfigToml,
  sha256Hex,
  startRunner,
  startServer,
  stopInOrder,
  survivorsOf,
  toml,
  waitForRunner,
} from "./local-stack.mjs";
import { installPinned } from "./pinned-install.mjs";

export { ROOT, toml };

export const say = (line = "") => process.stdout.write(`${line}\n`);

// ---- the adapter ----------------------------------------------------------------

function findPackageJson(start) {
  let dir = dirname(start);
  for (let i = 0; i < 6; i++) {
    const file = join(dir, "package.json");
    if (existsSync(file)) return file;
    dir = dirname(dir);
  }
  return undefined;
}

/**
 * The adapter to run: `${prefix}_SCRIPT` (+ `${prefix}_NODE`) when given,
 * else `pkg@version` installed on demand into `cacheDir` (entry: `entry`
 * inside the package).
 */
export function resolveAdapter({ pkg, version, cacheDir, prefix, entry }) {
  const script = process.env[`${prefix}_SCRIPT`];
  if (script) {
    const node = process.env[`${prefix}_NODE`];
    if (!node) throw new Error(`${prefix}_SCRIPT needs ${prefix}_NODE (the node binary to run it)`);
    if (!existsSync(script)) throw new Error(`${prefix}_SCRIPT does not exist`);
    if (!existsSync(node)) throw new Error(`${prefix}_NODE does not exist`);
    return { node, script, source: `${prefix}_SCRIPT`, strictVersion: false };
  }
  const installed = join(cacheDir, "node_modules", ...pkg.split("/"), ...entry.split("/"));
  if (!existsSync(installed)) {
    say(`installing ${pkg}@${version} into ${cacheDir} …`);
    const result = installPinned(cacheDir, [`${pkg}@${version}`]);
    if (!result.ok || !existsSync(installed)) {
      throw new Error(`npm install of ${pkg}@${version} failed (exit ${result.status}); is the registry reachable?`);
    }
  }
  return { node: process.execPath, script: installed, source: ".smoke-cache", strictVersion: true };
}

/** The adapter's package.json must name `pkg`; a cached install must be exactly `version`. */
export function verifyAdapter(adapter, { pkg, version }) {
  const file = findPackageJson(adapter.script);
  if (file === undefined) throw new Error("the adapter's package.json was not found next to its script");
  const meta = JSON.parse(readFileSync(file, "utf8"));
  if (meta.name !== pkg) throw new Error(`the adapter's package.json names ${meta.name}, not ${pkg}`);
  if (meta.version !== version) {
    if (adapter.strictVersion) throw new Error(`the cached adapter is ${meta.version}, expected ${version}`);
    say(`  note: the given adapter is ${meta.version}; this smoke is pinned to ${version}`);
  }
  return meta.version;
}

// ---- environment mapping ----------------------------------------------------------

/** Variables mapped through unchanged when the Runner has them (proxies, CAs, identity). */
export const PASS_THROUGH = [
  "USER",
  "SHELL",
  "HTTP_PROXY",
  "HTTPS_PROXY",
  "ALL_PROXY",
  "NO_PROXY",
  "http_proxy",
  "https_proxy",
  "all_proxy",
  "no_proxy",
  "SSL_CERT_FILE",
  "SSL_CERT_DIR",
  "NODE_EXTRA_CA_CERTS",
];

export function envTable(mapping) {
  return Object.entries(mapping)
    .map(([child, source]) => `${child} = ${toml(source)}`)
    .join("\n");
}

// ---- projects -------------------------------------------------------------------------

const ACCEPTANCE_TESTS = `import unittest

from textutil import slugify


class AcceptanceTests(unittest.TestCase):
    def test_punctuation_becomes_one_dash(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_spaces_collapse_and_ends_are_trimmed(self):
        self.assertEqual(slugify("  Many   spaces here  "), "many-spaces-here")

    def test_already_a_slug(self):
        self.assertEqual(slugify("already-a-slug"), "already-a-slug")

    def test_digits_stay(self):
        self.assertEqual(slugify("Top 10 Tips (2024)"), "top-10-tips-2024")

    def test_empty(self):
        self.assertEqual(slugify(""), "")


if __name__ == "__main__":
    unittest.main()
`;

export function git(cwd, ...args) {
  execFileSync("git", ["-c", "user.name=WebCodex smoke", "-c", "user.email=smoke@webcodex.invalid", ...args], {
    cwd,
    stdio: "ignore",
  });
}

/** A Git project with an unimplemented `slugify` (and, `withTests`, its fixed acceptance tests). */
export function makeProject(dir, withTests) {
  mkdirSync(join(dir, "tests"), { recursive: true });
  writeFileSync(
    join(dir, "textutil.py"),
    `def slugify(title: str) -> str:
    """Lower-case \`title\`, turn every run of characters that are not ASCII letters
    or digits into a single '-', and strip '-' from both ends."""
    raise NotImplementedError
`,
  );
  writeFileSync(join(dir, "tests", "__init__.py"), "");
  if (withTests) writeFileSync(join(dir, "tests", "test_acceptance.py"), ACCEPTANCE_TESTS);
  writeFileSync(
    join(dir, "README.md"),
    "# textutil\n\nRun the tests with `python3 -m unittest discover -s tests -t .`\n",
  );
  git(dir, "init", "-q");
  git(dir, "add", "-A");
  git(dir, "commit", "-q", "-m", "textutil: slugify is not implemented yet");
}

export function sha256File(file) {
  return createHash("sha256").update(readFileSync(file)).digest("hex");
}

// ---- the stack --------------------------------------------------------------------------

export const PRINCIPAL = "smoke";

/**
 * A Server and a Runner in `stack.work`: `projects` are made (the first
 * `withTests` of them get acceptance tests), `acpToml` is the Runner's
 * `[acp]` part (tables and agents), the Runner runs with `runnerEnv`.
 * Resolves once the Runner is connected.
 */
export async function startStack(stack, { projects, testProjects, acpToml, runnerEnv }) {
  const { work } = stack;
  const log = (name) => (line) => {
    try {
      writeFileSync(stack.logFile, `[${name}] ${line}\n`, { flag: "a" });
    } catch {}
  };
  const runnerToken = newRunnerToken();
  const serverToml = join(work, "server.toml");
  const scopes = ["coding_agent:run", "project:read", "project:write"];
  writeFileSync(
    serverToml,
    serverConfigToml({
      port: 0,
      runnerId: "smoke-runner",
      runnerTokenSha256: sha256Hex(runnerToken),
      projects,
      principals: [{ id: PRINCIPAL, scopes, projects }],
    }),
  );
  const { token } = issuePrincipalToken({ configFile: serverToml, cwd: work, principal: PRINCIPAL, scopes, projects });
  stack.token = token;
  const server = await startServer({ configFile: serverToml, cwd: work, onLine: log("server") });
  stack.server = server.child;
  stack.url = `http://127.0.0.1:${server.port}/mcp`;
  writeFileSync(join(work, "runner.token"), `${runnerToken}\n`, { mode: 0o600 });
  for (const id of projects) makeProject(join(work, id), testProjects.includes(id));
  const runnerToml = join(work, "runner.toml");
  writeFileSync(
    runnerToml,
    `[runner]
state_dir = "runner"
log_level = "info"

[server]
url = ${toml(`ws://127.0.0.1:${server.port}/runner`)}
token_file = "runner.token"

${projects.map((id) => `[[projects]]\nid = ${toml(id)}\nroot = ${toml(join(work, id))}\nallow_patch = true\n`).join("\n")}
${acpToml}`,
    { mode: 0o600 },
  );
  stack.runner = startRunner({ configFile: runnerToml, cwd: work, env: runnerEnv, onLine: log("runner") });
  const runnerExited = () => stack.runner.exitCode !== null || stack.runner.signalCode !== null;
  await waitForRunner({
    url: stack.url,
    token,
    projectId: projects[0],
    timeoutMs: 60_000,
    shouldStop: runnerExited,
  });
  if (runnerExited()) throw new Error(`the Runner exited during start-up (its log: ${stack.logFile})`);
}

function trackPids(stack) {
  for (const child of [stack.server, stack.runner]) {
    if (child?.pid === undefined) continue;
    for (const [pid, start] of descendants(child.pid)) stack.pids.set(pid, start);
  }
}

async function stopStack(stack) {
  try {
    trackPids(stack);
  } catch {}
  await stopInOrder([stack.runner, stack.server], 15_000);
  const survivors = survivorsOf(stack.pids);
  if (process.env.WEBCODEX_SMOKE_DEBUG === "1") {
    for (const pid of survivors) {
      try {
        say(`      survivor ${pid}: ${readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0")[0]}`);
      } catch {}
    }
  }
  for (const pid of survivors) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {}
  }
  return survivors.length;
}

// ---- cases --------------------------------------------------------------------------------

/**
 * One run through the real MCP client, followed to its end: its final observation, the event kinds counted,
 * its run id, and the agent's text (`text`: for a case's own checks only, never printed). `continueRunId`:
 * a follow-up turn in that run's agent session (design §17).
 */
export async function runCase(
  stack,
  { project, provider, prompt, timeoutSecs, cancelOnProgress = false, continueRunId = undefined },
) {
  const { McpRunsClient, followRun } = await import(BINS.cliLib);
  const client = new McpRunsClient({ url: stack.url, token: stack.token });
  const kinds = {};
  let text = "";
  let cancelled = false;
  try {
    const start = await client.start({
      project_id: project,
      provider_id: provider,
      idempotency_key: `smoke-${Date.now()}-${Math.random().toString(36).slice(2)}`,
      prompt,
      timeout_secs: timeoutSecs,
      ...(continueRunId === undefined ? {} : { continue_run_id: continueRunId }),
    });
    const final = await followRun({
      client,
      runId: start.run_id,
      token: start.observation_token,
      onObservation: (obs) => {
        trackPids(stack);
        for (const event of obs.events) {
          kinds[event.kind] = (kinds[event.kind] ?? 0) + 1;
          if (event.kind === "agent_message" && typeof event.text === "string") text += event.text;
        }
        const progress = (kinds.agent_message ?? 0) + (kinds.tool_activity ?? 0) + (kinds.reasoning ?? 0);
        if (cancelOnProgress && !cancelled && progress > 0 && obs.state === "running") {
          cancelled = true;
          client.cancel(start.run_id).catch(() => {});
        }
      },
    });
    return { final, kinds, cancelled, runId: start.run_id, text };
  } finally {
    await client.close();
  }
}

/**
 * The two-turn case (design §17): turn 1 is told a fresh nonce, turn 2 continues turn 1 (`continue_run_id`) and
 * must answer it. Checks both turns completed, the chain as observe names it, and that the nonce came back;
 * the agent's text itself is never printed.
 */
export async function twoTurnCase(stack, { project, provider, timeoutSecs }) {
  const nonce = `wc-${createHash("sha256").update(String(Math.random())).digest("hex").slice(0, 12)}`;
  const first = await runCase(stack, {
    project,
    provider,
    prompt: `Remember this code word for later: ${nonce}. Do not run any tools. Reply with just OK.`,
    timeoutSecs,
  });
  const problems = [];
  if (first.final.state !== "completed") {
    problems.push(`turn 1 ended ${first.final.state}/${first.final.failure_kind ?? "-"}, expected completed`);
    return { result: first, problems, detail: "turn 2 not started" };
  }
  const second = await runCase(stack, {
    project,
    provider,
    prompt: "What code word did I ask you to remember? Do not run any tools. Reply with the code word only.",
    timeoutSecs,
    continueRunId: first.runId,
  });
  if (second.final.state !== "completed") {
    problems.push(`turn 2 ended ${second.final.state}/${second.final.failure_kind ?? "-"}, expected completed`);
  }
  if (second.final.parent_run_id !== first.runId) problems.push("turn 2 does not name turn 1 as parent_run_id");
  const recalled = second.text.includes(nonce);
  if (!recalled) problems.push("turn 2's answer does not contain turn 1's code word");
  return { result: second, problems, detail: `recalled turn 1's code word: ${recalled ? "yes" : "no"}` };
}

export function summarize(result) {
  const { final, kinds } = result;
  const counts = Object.entries(kinds)
    .map(([k, n]) => `${k}×${n}`)
    .join(" ");
  return `${final.state}/${final.execution_state}${final.stop_reason ? ` stop=${final.stop_reason}` : ""}${final.failure_kind ? ` failure=${final.failure_kind}` : ""}${counts ? ` events: ${counts}` : ""}`;
}

/** Problems with a coding case's project: acceptance tests untouched and passing, a new test file, slugify done. */
export function codingProblems(dir, acceptanceSha) {
  const acceptance = join(dir, "tests", "test_acceptance.py");
  const problems = [];
  if (!existsSync(acceptance) || sha256File(acceptance) !== acceptanceSha)
    problems.push("tests/test_acceptance.py was changed");
  const extra = readdirSync(join(dir, "tests")).filter((f) => /^test_.*\.py$/.test(f) && f !== "test_acceptance.py");
  if (extra.length === 0) problems.push("no new test file under tests/");
  if (readFileSync(join(dir, "textutil.py"), "utf8").includes("raise NotImplementedError"))
    problems.push("slugify is still not implemented");
  const tests = spawnSync("python3", ["-m", "unittest", "tests.test_acceptance"], {
    cwd: dir,
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", PYTHONDONTWRITEBYTECODE: "1" },
    stdio: "ignore",
    timeout: 60_000,
  });
  if (tests.status !== 0) problems.push("the acceptance tests fail when run independently");
  return { problems, extra };
}

/** The fixed, secret-free summaries a terminal message may carry. */
export async function fixedSummaries() {
  const { FAILURE_SUMMARIES } = await import(join(ROOT, "packages", "protocol", "dist", "index.js"));
  return Object.values(FAILURE_SUMMARIES);
}

// ---- main -----------------------------------------------------------------------------------

/**
 * Runs one smoke: builds the stack with `start(stack)`, then each case
 * `[id, title, fn, skipReason]` (fn(stack) → {result, problems, detail}),
 * prints one line per case, stops everything, and sets the exit code.
 */
export async function runSmoke({ name, start, cases }) {
  if (!existsSync(BINS.cliLib) || !existsSync(join(ROOT, "packages", "runner", "dist"))) {
    throw new Error(`the packages are not built; run \`npm run ${name}\` (it builds first)`);
  }
  const work = mkdtempSync(join(tmpdir(), "webcodex-smoke-"));
  const outcomes = [];
  const stack = {
    work,
    logFile: join(work, "daemons.log"),
    server: undefined,
    runner: undefined,
    url: "",
    token: "",
    pids: new Map(),
  };
  let survivors = 0;
  const onSignal = () => {
    say(`${name} interrupted; stopping the stack`);
    void stopStack(stack).then(() => process.exit(130));
  };
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    await start(stack);
    for (const [id, title, fn, skip] of cases) {
      if (skip !== undefined) {
        outcomes.push({ id, title, status: "skipped", note: skip });
        say(`  (${id}) ${title}: SKIPPED — ${skip}`);
        continue;
      }
      try {
        const { result, problems, detail } = await fn(stack);
        const status = problems.length === 0 ? "passed" : "failed";
        outcomes.push({ id, title, status });
        say(`  (${id}) ${title}: ${status.toUpperCase()} — ${summarize(result)}${detail ? ` · ${detail}` : ""}`);
        for (const problem of problems) say(`      ✗ ${problem}`);
      } catch (err) {
        outcomes.push({ id, title, status: "failed" });
        say(`  (${id}) ${title}: FAILED — ${err instanceof Error ? err.message : String(err)}`);
      }
    }
  } finally {
    survivors = await stopStack(stack);
  }
  if (survivors > 0) {
    say(`  ✗ ${survivors} process(es) outlived the stack and were killed`);
    outcomes.push({ id: "-", title: "process cleanup", status: "failed" });
  }
  const failed = outcomes.filter((o) => o.status === "failed");
  const passed = outcomes.filter((o) => o.status === "passed").length;
  const skipped = outcomes.filter((o) => o.status === "skipped").length;
  say(`${name}: ${passed} passed, ${failed.length} failed, ${skipped} skipped`);
  if (failed.length > 0) {
    say(`  daemon logs (no prompts or agent output): ${join(work, "daemons.log")}`);
    process.exitCode = 1;
  } else {
    rmSync(work, { recursive: true, force: true });
  }
}
