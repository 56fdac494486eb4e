#!/usr/bin/env node
/**
 * `npm run test:conformance` — the official MCP conformance suite
 * (@modelcontextprotocol/conformance, pinned in conformance-install.mjs) in
 * server mode against a real `webcodex-server run` child on 127.0.0.1.
 *
 * Three passes against the same Server: the scenarios MCP 2026-07-28
 * requires (`--requirements 2026-07-28`), those 2025-11-25 requires, and the
 * Tasks extension's `tasks-*` scenarios (which the 2026 set runs but never
 * scores). The suite cannot send a bearer token, so it talks to a loopback
 * proxy (auth-proxy.mjs) that adds a configured principal's token and changes
 * nothing else. Scenarios for MCP features we deliberately do not offer are
 * listed, one reason each, in each pass's baseline file; a pass fails on any
 * other failure and on a baseline entry that now passes.
 *
 * Exit code: 0 when every pass exits 0. Results: bench-results/conformance/<pass>/
 * (checks.json per scenario).
 */
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { ROOT, sha256Hex, startServer, stopInOrder, toml } from "../local-stack.mjs";
import { startAuthProxy } from "./auth-proxy.mjs";
import { ensureConformanceInstalled } from "./conformance-install.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
export const BASELINE = join(HERE, "conformance-baseline.yml");

/** The suite's runs, each with its own expected-failures baseline. */
export const PASSES = [
  { name: "2026-07-28", args: ["--requirements", "2026-07-28"], baseline: join(HERE, "conformance-baseline-2026.yml") },
  { name: "2025-11-25", args: ["--requirements", "2025-11-25"], baseline: BASELINE },
  ...[
    "tasks-lifecycle",
    "tasks-capability-negotiation",
    "tasks-wire-fields",
    "tasks-request-state-removal",
    "tasks-mrtr-input",
    "tasks-request-headers",
    "tasks-dispatch-and-envelope",
    "tasks-status-notifications",
    "tasks-required-task-error",
    "tasks-mrtr-composition",
  ].map((scenario) => ({
    name: scenario,
    args: ["--scenario", scenario],
    baseline: join(HERE, "conformance-baseline-tasks.yml"),
  })),
];
/** Bound on the whole suite run; the pinned suite takes well under a minute here. */
const SUITE_TIMEOUT_MS = 5 * 60_000;

export async function runConformance({ log = (line) => process.stderr.write(`${line}\n`), outDir } = {}) {
  const installed = ensureConformanceInstalled(log);
  const dir = mkdtempSync(join(tmpdir(), "wc-conformance-"));
  const token = `wct_${randomBytes(24).toString("base64url")}`;
  const runnerToken = `wcr_${randomBytes(24).toString("base64url")}`;
  const scopes = ["coding_agent:run", "project:write", "project:read"];
  const configFile = join(dir, "server.toml");
  writeFileSync(
    configFile,
    `[server]\nhost = "127.0.0.1"\nport = 0\nstate_dir = "state"\n\n` +
      `[[runners]]\nid = "local"\ntoken_sha256 = ${toml(sha256Hex(runnerToken))}\nprojects = ["demo"]\n\n` +
      `[[principals]]\nid = "conformance"\nscopes = ${JSON.stringify(scopes)}\nprojects = ["demo"]\n` +
      `token_sha256 = [${toml(sha256Hex(token))}]\ntoken_scopes = ${JSON.stringify(scopes)}\nallow_coding_agent_run = true\n`,
  );
  let server;
  let proxy;
  try {
    const serverLines = [];
    const started = await startServer({
      configFile,
      cwd: dir,
      env: { ...process.env, WEBCODEX_LOG_LEVEL: "warn" },
      onLine: (line) => serverLines.push(line),
    });
    server = started.child;
    proxy = await startAuthProxy({ targetPort: started.port, token });
    const results = outDir ?? join(ROOT, "bench-results", "conformance");
    rmSync(results, { recursive: true, force: true });
    mkdirSync(results, { recursive: true });
    let output = "";
    let code = 0;
    for (const pass of PASSES) {
      const passDir = join(results, pass.name);
      mkdirSync(passDir, { recursive: true });
      const args = [
        installed.cli,
        "server",
        "--url",
        `http://127.0.0.1:${proxy.port}/mcp`,
        ...pass.args,
        "--expected-failures",
        pass.baseline,
        "--output-dir",
        passDir,
      ];
      output += `\n=== conformance pass ${pass.name} ===\n`;
      const passCode = await new Promise((resolve, reject) => {
        const child = spawn(installed.node, args, { cwd: dir, stdio: ["ignore", "pipe", "pipe"] });
        const timer = setTimeout(() => {
          child.kill("SIGKILL");
          reject(new Error(`conformance pass ${pass.name} did not finish within ${SUITE_TIMEOUT_MS / 1000} s`));
        }, SUITE_TIMEOUT_MS);
        for (const s of [child.stdout, child.stderr]) s.on("data", (c) => (output += c.toString("utf8")));
        child.once("error", reject);
        child.once("exit", (c) => {
          clearTimeout(timer);
          resolve(c ?? 1);
        });
      });
      output += `=== conformance pass ${pass.name}: exit ${passCode} ===\n`;
      if (passCode !== 0) code = passCode;
    }
    return { code, output, results, serverLines };
  } finally {
    await proxy?.close();
    await stopInOrder([server]);
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const started = Date.now();
  const { code, output } = await runConformance();
  process.stdout.write(output);
  process.stdout.write(`\nconformance suite: exit ${code} in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
  process.exit(code);
}
