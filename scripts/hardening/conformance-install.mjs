/**
 * The official MCP conformance suite and the Node 22 it needs, installed once
 * into a cache folder outside the product's runtime (`.hardening-cache/`, git-
 * ignored) by the shared pinned installer (scripts/pinned-install.mjs), which
 * approves the `node` package's install script in the cache's own package.json.
 * Both versions are pinned here.
 */
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { ROOT } from "../local-stack.mjs";
import { installPinned, npmIn } from "../pinned-install.mjs";

export const CONFORMANCE_VERSION = "0.2.0-alpha.12";
export const NODE22_VERSION = "22.23.3";
export const CACHE_DIR = join(ROOT, ".hardening-cache", `conformance-${CONFORMANCE_VERSION}-node-${NODE22_VERSION}`);

/** Paths of the Node 22 binary and the suite's CLI script in the cache. */
export const INSTALLED = {
  node: join(CACHE_DIR, "node_modules", "node", "bin", "node"),
  cli: join(CACHE_DIR, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js"),
};

function works() {
  if (!existsSync(INSTALLED.node) || !existsSync(INSTALLED.cli)) return false;
  try {
    const v = execFileSync(INSTALLED.node, ["--version"], { encoding: "utf8" }).trim();
    return v === `v${NODE22_VERSION}`;
  } catch {
    return false;
  }
}

/** Installs on first use (a few seconds with a warm npm cache); returns INSTALLED. */
export function ensureConformanceInstalled(log = (line) => process.stderr.write(`${line}\n`)) {
  if (works()) return INSTALLED;
  log(
    `installing @modelcontextprotocol/conformance@${CONFORMANCE_VERSION} and node@${NODE22_VERSION} into ${CACHE_DIR}`,
  );
  const installed = installPinned(
    CACHE_DIR,
    [`node@${NODE22_VERSION}`, `@modelcontextprotocol/conformance@${CONFORMANCE_VERSION}`],
    { approveScripts: ["node"], inherit: true },
  );
  if (!installed.ok) throw new Error(`npm install into ${CACHE_DIR} failed: ${installed.why}`);
  if (!works()) npmIn(CACHE_DIR, ["rebuild", "node"], { inherit: true });
  if (!works()) throw new Error(`node@${NODE22_VERSION} did not install a working binary at ${INSTALLED.node}`);
  return INSTALLED;
}
