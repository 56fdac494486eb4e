/** Machine and version info recorded with every result. */
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { cpus, loadavg, totalmem } from "node:os";
import { join } from "node:path";
import { REPO } from "./paths.mjs";

function version(dir) {
  const file = join(REPO, dir, "package.json");
  if (!existsSync(file)) return null;
  try {
    return JSON.parse(readFileSync(file, "utf8")).version ?? null;
  } catch {
    return null;
  }
}

function gitCommit() {
  try {
    return execFileSync("git", ["rev-parse", "--short", "HEAD"], { cwd: REPO, encoding: "utf8" }).trim();
  } catch {
    return null;
  }
}

export function machineInfo() {
  const cpu = cpus();
  return {
    cpu_model: cpu[0]?.model ?? "unknown",
    cores: cpu.length,
    mem_total_mb: Math.round(totalmem() / (1024 * 1024)),
    loadavg_at_start: loadavg(),
    node: process.version,
    platform: `${process.platform}-${process.arch}`,
    git_commit: gitCommit(),
    packages: {
      "@webcodex/protocol": version("packages/protocol"),
      "@webcodex/runner": version("packages/runner"),
      "@webcodex/server": version("packages/server"),
      "@webcodex/fake-acp-agent": version("fake-acp-agent"),
      "@agentclientprotocol/sdk": version("node_modules/@agentclientprotocol/sdk"),
      "@modelcontextprotocol/sdk": version("node_modules/@modelcontextprotocol/sdk"),
      ws: version("node_modules/ws"),
      "better-sqlite3": version("node_modules/better-sqlite3"),
      zod: version("node_modules/zod"),
    },
  };
}
