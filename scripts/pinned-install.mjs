/**
 * Pinned npm packages for the tools around the product — the MCP conformance suite
 * (hardening/conformance-install.mjs), the bench's acpx peer (bench/lib/peer-install.mjs) and the
 * smokes' real adapters (smoke-lib.mjs) — installed on first use with the ordinary npm client into a
 * cache folder of their own (git-ignored), never into the workspace's node_modules or lockfile.
 *
 * The `node` package fetches its binary in an install script, which npm ≥ 11 blocks until that
 * package is approved: `approveScripts` writes the approval into the cache's package.json before the
 * install, `approveAndRebuild` approves and rebuilds after it.
 */
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/** Bound of each npm step (the node@22 package alone is ~40 MB compressed). */
export const NPM_STEP_TIMEOUT_MS = 5 * 60_000;
/** Characters of npm's last output lines kept to say why a step failed. */
export const MAX_NPM_WHY_CHARS = 300;

const NPM = process.platform === "win32" ? "npm.cmd" : "npm";

/**
 * One npm step in `dir`. Never throws: `{ ok, status, why }`, `why` being the last two lines npm wrote
 * (bounded) or its exit. `inherit`: npm's output goes to this process's stdout and stderr instead.
 */
export function npmIn(dir, args, { inherit = false } = {}) {
  const r = spawnSync(NPM, args, {
    cwd: dir,
    stdio: inherit ? ["ignore", "inherit", "inherit"] : ["ignore", "pipe", "pipe"],
    timeout: NPM_STEP_TIMEOUT_MS,
    encoding: "utf8",
  });
  const said = (r.stderr || r.stdout || String(r.error ?? "")).trim().split("\n").slice(-2).join(" ");
  return { ok: r.status === 0, status: r.status, why: said.slice(0, MAX_NPM_WHY_CHARS) || `exit ${r.status}` };
}

/**
 * Install the exact `specs` (`name@version`) into `dir`, created if missing. `approveScripts`: the
 * packages whose install scripts may run (the cache's package.json is written with only those);
 * `ignoreScripts`: none runs (`--ignore-scripts`).
 */
export function installPinned(dir, specs, { approveScripts = [], ignoreScripts = false, inherit = false } = {}) {
  mkdirSync(dir, { recursive: true });
  if (approveScripts.length > 0) {
    const allowScripts = Object.fromEntries(approveScripts.map((name) => [name, true]));
    writeFileSync(join(dir, "package.json"), `${JSON.stringify({ private: true, allowScripts }, null, 2)}\n`);
  }
  return npmIn(
    dir,
    [
      "install",
      "--prefix",
      dir,
      "--save-exact",
      "--no-audit",
      "--no-fund",
      "--loglevel=error",
      ...(ignoreScripts ? ["--ignore-scripts"] : []),
      ...specs,
    ],
    { inherit },
  );
}

/** Approve `name`'s install script in `dir` and run it again (`npm rebuild`); the rebuild's outcome. */
export function approveAndRebuild(dir, name, { inherit = false } = {}) {
  npmIn(dir, ["install-scripts", "approve", name], { inherit });
  return npmIn(dir, ["rebuild", name], { inherit });
}

/** The version of `name` installed in `dir`, or null. */
export function installedVersion(dir, name) {
  try {
    return JSON.parse(readFileSync(join(dir, "node_modules", name, "package.json"), "utf8")).version ?? null;
  } catch {
    return null;
  }
}
