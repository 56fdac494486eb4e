#!/usr/bin/env node
/**
 * `npm run test:conformance` — the official MCP conformance suite
 * (@modelcontextprotocol/conformance, pinned in conformance-install.mjs) in
 * server mode against a real `webcodex-server run` child on 127.0.0.1.
 *
 * The suite cannot send a bearer token, so it talks to a loopback proxy
 * (auth-proxy.mjs) that adds a configured principal's token and changes
 * nothing else. Scenarios for MCP features we deliberately do not offer are
 * listed, one reason each, in conformance-baseline.yml; the suite exits 1 on
 * any other failure and on a baseline entry that now passes.
 *
 * Exit code: the suite's. Results: bench-results/conformance/ (checks.json
 * per scenario).
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
    const args = [
      installed.cli,
      "server",
      "--url",
      `http://127.0.0.1:${proxy.port}/mcp`,
      "--expected-failures",
      BASELINE,
      "--output-dir",
      results,
    ];
    let output = "";
    const code = await new Promise((resolve, reject) => {
      const child = spawn(installed.node, args, { cwd: dir, stdio: ["ignore", "pipe", "pipe"] });
      const timer = setTimeout(() => {
        child.kill("SIGKILL");
        reject(new Error(`the conformance suite did not finish within ${SUITE_TIMEOUT_MS / 1000} s`));
      }, SUITE_TIMEOUT_MS);
      for (const s of [child.stdout, child.stderr]) s.on("data", (c) => (output += c.toString("utf8")));
      child.once("error", reject);
      child.once("exit", (c) => {
        clearTimeout(timer);
        resolve(c ?? 1);
      });
    });
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
