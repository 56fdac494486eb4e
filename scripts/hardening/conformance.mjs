#!/usr/bin/env node
/**
 * `npm run test:conformance` — the official MCP conformance suite
 * (@modelcontextprotocol/conformance, pinned in conformance-install.mjs) in
 * server mode against a real `webcodex-server run` child on 127.0.0.1.
 *
 * Server passes against the same Server: the scenarios MCP 2026-07-28
 * requires (`--requirements 2026-07-28`), those 2025-11-25 requires, and the
 * Tasks extension's `tasks-*` scenarios (which the 2026 set runs but never
 * scores). The suite cannot send a bearer token, so it talks to a loopback
 * proxy (auth-proxy.mjs) that adds a configured principal's token and changes
 * nothing else. Scenarios for MCP features we deliberately do not offer are
 * listed, one reason each, in each pass's baseline file; a pass fails on any
 * other failure and on a baseline entry that now passes.
 *
 * Then the `authorization` pass: the suite's authorization mode against an
 * OAuth-enabled Server, consent given in headless Chromium
 * (conformance-authorization.mjs); no expected failures.
 *
 * `node conformance.mjs [PASS…]` runs only the named passes (default: all).
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
import { runAuthorizationPass } from "./conformance-authorization.mjs";
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
/** The authorization-mode pass, run after the server passes. */
export const AUTHORIZATION_PASS = "authorization";
/** Bound on each pass; the pinned suite takes well under a minute here. */
const SUITE_TIMEOUT_MS = 5 * 60_000;

/** `only`: pass names to run (default: every pass in PASSES, then AUTHORIZATION_PASS). */
export async function runConformance({
  log = (line) => process.stderr.write(`${line}\n`),
  outDir,
  only = [...PASSES.map((p) => p.name), AUTHORIZATION_PASS],
} = {}) {
  const known = new Set([...PASSES.map((p) => p.name), AUTHORIZATION_PASS]);
  const unknown = only.filter((n) => !known.has(n));
  if (unknown.length > 0)
    throw new Error(`unknown conformance pass ${unknown.join(", ")}; passes: ${[...known].join(", ")}`);
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
    for (const pass of PASSES.filter((p) => only.includes(p.name))) {
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
    if (only.includes(AUTHORIZATION_PASS)) {
      const passDir = join(results, AUTHORIZATION_PASS);
      mkdirSync(passDir, { recursive: true });
      output += `\n=== conformance pass ${AUTHORIZATION_PASS} ===\n`;
      const pass = await runAuthorizationPass({ installed, dir, outputDir: passDir, timeoutMs: SUITE_TIMEOUT_MS });
      output += pass.output;
      serverLines.push(...pass.serverLines);
      output += `=== conformance pass ${AUTHORIZATION_PASS}: exit ${pass.code} ===\n`;
      if (pass.code !== 0) code = pass.code;
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
  const only = process.argv.slice(2);
  const { code, output } = await runConformance(only.length > 0 ? { only } : {});
  process.stdout.write(output);
  process.stdout.write(`\nconformance suite: exit ${code} in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
  process.exit(code);
}
