#!/usr/bin/env node
/**
 * A transparent stdio wrapper around an ACP agent that timestamps, as they
 * leave the agent, the `tick N` chunks of the fake agent's `slow` scenario:
 *   node tap-agent.mjs --tap FILE -- AGENT_COMMAND [ARGS...]
 * Appends {"tick":N,"hr_ms":T} per tick to FILE (hr_ms = performance.timeOrigin
 * + performance.now(), the same clock as the agent's ledger). Bytes pass
 * through unchanged; the wrapper exits with the agent.
 */
import { spawn } from "node:child_process";
import { appendFileSync } from "node:fs";

const sep = process.argv.indexOf("--");
const tapIndex = process.argv.indexOf("--tap");
if (sep < 0 || tapIndex < 0 || tapIndex > sep || sep + 1 >= process.argv.length) {
  process.stderr.write("usage: tap-agent.mjs --tap FILE -- COMMAND [ARGS...]\n");
  process.exit(2);
}
const tapFile = process.argv[tapIndex + 1];
const [command, ...args] = process.argv.slice(sep + 1);

const child = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
process.stdin.pipe(child.stdin);
child.stdin.on("error", () => {});
process.stdout.on("error", () => child.kill("SIGTERM"));

const TICK = /tick (\d+)\\n/g;
const seen = new Set();
let tail = "";
child.stdout.on("data", (chunk) => {
  process.stdout.write(chunk);
  const at = performance.timeOrigin + performance.now();
  const text = tail + chunk.toString("utf8");
  tail = text.slice(-24);
  let lines = "";
  for (const m of text.matchAll(TICK)) {
    const tick = Number(m[1]);
    if (seen.has(tick)) continue;
    seen.add(tick);
    lines += `${JSON.stringify({ tick, hr_ms: at })}\n`;
  }
  if (lines) appendFileSync(tapFile, lines);
});

for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"]) {
  process.on(signal, () => child.kill(signal));
}
child.on("exit", (code, signal) => {
  process.exitCode = code ?? (signal ? 1 : 0);
  process.stdout.end();
});
