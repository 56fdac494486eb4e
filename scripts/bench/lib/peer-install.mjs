/**
 * The peer of the `peer` suite: pinned `acpx` running on a pinned Node 22,
 * installed into a cache folder on first use by the shared pinned installer
 * (scripts/pinned-install.mjs), or given by WEBCODEX_BENCH_ACPX_SCRIPT +
 * WEBCODEX_BENCH_ACPX_NODE.
 * Never throws: returns { node, script, … } or { skipped: "why" }.
 */
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { approveAndRebuild, installedVersion, installPinned } from "../../pinned-install.mjs";
import { REPO } from "./paths.mjs";

export const ACPX_VERSION = "0.19.1";
export const PEER_NODE_MAJOR = 22;
export const PEER_CACHE_DIR = join(REPO, ".bench-cache", `acpx-${ACPX_VERSION}-node${PEER_NODE_MAJOR}`);

/** The major version `node` reports, or null when it does not run. */
function nodeMajor(node) {
  if (!existsSync(node)) return null;
  const r = spawnSync(node, ["--version"], { encoding: "utf8", timeout: 30_000 });
  const m = /^v(\d+)\./.exec(r.stdout ?? "");
  return m ? Number(m[1]) : null;
}

/** The node@22 binary inside the cache: the package's bin, or the arch package its install script fetches. */
function cachedNode(dir) {
  const arch = `node-${process.platform}-${process.arch}`;
  return [
    join(dir, "node_modules/node/bin/node"),
    join(dir, "node_modules/node/node_modules", arch, "bin/node"),
    join(dir, "node_modules", arch, "bin/node"),
  ].find((p) => nodeMajor(p) === PEER_NODE_MAJOR);
}

export function ensurePeer(log = () => {}) {
  const script = process.env.WEBCODEX_BENCH_ACPX_SCRIPT;
  if (script) {
    const node = process.env.WEBCODEX_BENCH_ACPX_NODE;
    if (!node || !existsSync(node) || !existsSync(script)) {
      return { skipped: "WEBCODEX_BENCH_ACPX_SCRIPT needs WEBCODEX_BENCH_ACPX_NODE, and both must exist" };
    }
    return { node, script, node_version: nodeMajor(node), acpx_version: null, source: "env" };
  }
  const dir = PEER_CACHE_DIR;
  const acpxScript = join(dir, "node_modules/acpx/dist/cli.js");
  if (installedVersion(dir, "acpx") !== ACPX_VERSION || !existsSync(acpxScript)) {
    log(`peer: installing acpx@${ACPX_VERSION} and node@${PEER_NODE_MAJOR} into ${dir} …`);
    const r = installPinned(dir, [`acpx@${ACPX_VERSION}`, `node@${PEER_NODE_MAJOR}`]);
    if (!r.ok || installedVersion(dir, "acpx") !== ACPX_VERSION) {
      return { skipped: `could not install acpx@${ACPX_VERSION} (offline?): ${r.why}` };
    }
  }
  let node = cachedNode(dir);
  if (!node) {
    // npm ≥ 11 blocks the node package's install script (it fetches the binary) until approved.
    log("peer: approving node's install script and rebuilding it …");
    const r = approveAndRebuild(dir, "node");
    node = cachedNode(dir);
    if (!node) return { skipped: `node@${PEER_NODE_MAJOR} did not install a runnable binary: ${r.why}` };
  }
  return {
    node,
    script: acpxScript,
    node_version: spawnSync(node, ["--version"], { encoding: "utf8" }).stdout.trim(),
    acpx_version: installedVersion(dir, "acpx"),
    source: ".bench-cache",
  };
}
