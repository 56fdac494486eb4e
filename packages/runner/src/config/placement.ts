/**
 * Where the Runner's own paths may be (design §4.1), checked on real paths when the config is loaded: a project
 * root exists, is a directory and is not `/`; no project root lies in a system tree, holds the Runner's config,
 * token or CA file, touches the state directory or nests in another root; and `runner.workspaces_dir`, needed by
 * run_as agents' worktree runs, is apart from the state directory and every project root. An agent works in its
 * project's root and its own tooling treats that tree as the project: none of the Runner's files may be in it.
 * Each check reports through the loader's `Report` (TOML key path, rule), so every problem is listed at once.
 */
import { realpathSync, statSync } from "node:fs";
import { basename, dirname, isAbsolute, join, resolve, sep } from "node:path";
import type { RawConfig } from "./schema.js";

/** Report one problem: the TOML key path and the rule it breaks. */
export type Report = (path: string, rule: string) => void;

/** A path of the config, resolved against the config file's directory `base`. */
export function resolveFrom(base: string, p: string): string {
  return isAbsolute(p) ? p : resolve(base, p);
}

/**
 * The real path of a project root (symlinks resolved once, here), reporting a
 * `..` segment in the configured path, a missing or non-directory root, and a
 * root that is the filesystem root `/` (an agent's cwd would be the whole machine).
 */
export function checkProjectRoot(base: string, root: string, path: string, err: Report): string {
  if (root.split(/[/\\]/).includes("..")) {
    err(path, "must not contain '..' segments (name the directory itself)");
  }
  const wanted = resolveFrom(base, root);
  try {
    const real = realpathSync(wanted);
    if (!statSync(real).isDirectory()) err(path, `${wanted} is not a directory`);
    else if (real === "/") err(path, `${wanted} resolves to / (a project root must be a project's directory)`);
    return real;
  } catch {
    err(path, `${wanted} does not exist`);
    return wanted;
  }
}

/**
 * System trees no project root may be or lie in: an agent's working directory there would be the
 * machine's configuration, kernel interfaces, devices, boot files or the administrator's home.
 */
export const SYSTEM_TREES: readonly string[] = Object.freeze(["/etc", "/proc", "/sys", "/dev", "/boot", "/root"]);

/** `p` with symlinks resolved as far as it exists (a state directory may not exist before the first start). */
export function realpathLoose(p: string): string {
  const rest: string[] = [];
  let at = resolve(p);
  for (;;) {
    try {
      return join(realpathSync(at), ...rest.reverse());
    } catch {
      const parent = dirname(at);
      if (parent === at) return resolve(p);
      rest.push(basename(at));
      at = parent;
    }
  }
}

/** Whether real path `inner` is `outer` or lies inside it. */
export function within(inner: string, outer: string): boolean {
  return inner === outer || inner.startsWith(outer.endsWith(sep) ? outer : outer + sep);
}

export interface PlacedRoot {
  readonly id: string;
  readonly path: string;
  /** The real path. */
  readonly root: string;
}
/**
 * Where project roots may not be (design §4.1), on real paths: in a system tree (`SYSTEM_TREES`);
 * holding the Runner's own config file (its directory), token file or CA file; being, lying in or
 * holding the state directory; or being, lying in or holding another project's root. An agent works
 * in its project's root, and its own tooling treats that tree as the project: none of these may be in it.
 */
export function checkRootPlacement(
  roots: readonly PlacedRoot[],
  own: { configDir: string; stateDir: string; tokenFile: string | null; caFile: string | null },
  err: Report,
): void {
  const configDir = realpathLoose(own.configDir);
  const stateDir = realpathLoose(own.stateDir);
  roots.forEach((p, i) => {
    const name = `project ${JSON.stringify(p.id)}`;
    const tree = SYSTEM_TREES.find((t) => within(p.root, realpathLoose(t)) || within(p.root, t));
    if (tree !== undefined) {
      err(p.path, `${name}: ${p.root} is in the system tree ${tree} (a project root must be a project's directory)`);
    }
    if (within(configDir, p.root)) {
      err(
        p.path,
        `${name}: ${p.root} holds the Runner's config file's directory ${configDir}; an agent working there could rewrite the Runner's config — keep the config outside every project root`,
      );
    }
    if (within(stateDir, p.root) || within(p.root, stateDir)) {
      const how = stateDir === p.root ? "is" : within(stateDir, p.root) ? "holds" : "is inside";
      err(
        p.path,
        `${name}: ${p.root} ${how} the Runner's state directory (runner.state_dir, ${stateDir}); an agent working there could read or rewrite the Runner's records — keep runner.state_dir and every project root apart`,
      );
    }
    for (const [key, f] of [
      ["server.token_file", own.tokenFile],
      ["server.ca_file", own.caFile],
    ] as const) {
      if (f !== null && within(realpathLoose(f), p.root)) {
        err(
          p.path,
          `${name}: ${p.root} holds the Runner's ${key} (${realpathLoose(f)}); an agent working there could read or replace it — keep it outside every project root`,
        );
      }
    }
    roots.slice(0, i).forEach((q) => {
      if (q.root === p.root) return; // reported as the same directory by the caller
      if (within(p.root, q.root) || within(q.root, p.root)) {
        const [inner, outer] = within(p.root, q.root) ? [p, q] : [q, p];
        err(
          p.path,
          `${name} and project ${JSON.stringify(q.id)} nest: project ${JSON.stringify(inner.id)}'s root ${inner.root} is inside project ${JSON.stringify(outer.id)}'s root ${outer.root} (each project needs its own directory tree)`,
        );
      }
    });
  });
}

/**
 * A run_as run's workspace is its pool user's (workspace/owned.ts): with run_as agents and a `worktree` project,
 * `runner.workspaces_dir` must be set, where that user can reach it, which the state dir (0700) is not, and apart
 * from the state dir and every project root.
 */
export function checkWorkspacesDirPlacement(raw: RawConfig, base: string, err: Report): void {
  const runAsAgent = raw.acp.agents.findIndex((a) => a.run_as !== undefined);
  const worktreeProject = raw.projects.findIndex((p) => p.workspace === "worktree");
  if (runAsAgent < 0 || worktreeProject < 0) return;
  const wanted = raw.runner.workspaces_dir;
  const dir = wanted === undefined ? null : realpathLoose(resolveFrom(base, wanted));
  const stateDir = realpathLoose(resolveFrom(base, raw.runner.state_dir));
  if (dir === null) {
    err(
      "runner.workspaces_dir",
      `projects[${worktreeProject}].workspace = "worktree" with run_as agents (acp.agents[${runAsAgent}].run_as) ` +
        "needs runner.workspaces_dir: a directory outside runner.state_dir and every project root that the pool " +
        "users can pass through (each run's workspace is made there, owned by its pool user; the Runner makes it 0711)",
    );
  } else if (within(dir, stateDir) || within(stateDir, dir)) {
    err("runner.workspaces_dir", `${dir} must be apart from runner.state_dir (${stateDir}), which stays 0700`);
  } else {
    raw.projects.forEach((p, i) => {
      const root = realpathLoose(resolveFrom(base, p.root));
      if (within(dir, root) || within(root, dir)) {
        err("runner.workspaces_dir", `${dir} must be apart from every project root (projects[${i}].root is ${root})`);
      }
    });
  }
}
