/**
 * The plants of a run that tries to make someone else's git run its code (issue 41 §1): for the run_as workspace
 * tests. Writes a 0777 script (it writes its uid to `canary` and fails) into `dir` (a directory every user can
 * reach), then points at it from every place it can write that git reads: `core.fsmonitor`, `core.hooksPath`,
 * an `include.path` and a `filter.planted` clean/smudge driver in every config file (its repository's, the
 * worktree config, its HOME's, the project's it finds through its alternates, a `commondir` of its own), a hook of every kind in every
 * hooks dir (its own, the project's, the hooksPath one), and `filter=planted` in `.gitattributes` and
 * `info/attributes`. Ledger `git_planted_all` with each outcome (`ok` or why not). No git command runs after
 * the plants (so only someone else's could run them). `hold=true`: then waits for session/cancel.
 */
import { execFileSync } from "node:child_process";
import { chmodSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { z } from "zod";
import { CANCELLED, END_TURN, type Scenario, say, scenario } from "../turn.js";

const AbsPath = z.string().regex(/^\/[A-Za-z0-9_./-]{1,255}$/, "must be an absolute path");
/** Longest one git call may take. */
const GIT_TIMEOUT_MS = 30_000;
/** The hooks planted in each hooks dir: what commit, checkout, status and ref updates run. */
const HOOKS = [
  "pre-commit",
  "prepare-commit-msg",
  "commit-msg",
  "post-commit",
  "post-checkout",
  "post-index-change",
  "reference-transaction",
  "pre-auto-gc",
  "post-rewrite",
  "post-merge",
];

const errno = (error: unknown) => (error as NodeJS.ErrnoException).code ?? "error";

function tryDo(work: () => void): string {
  try {
    work();
    return "ok";
  } catch (error) {
    const e = error as { status?: number | null; code?: string };
    return typeof e.status === "number" ? `exit ${e.status}` : errno(error);
  }
}

export const gitPlantAll: Scenario = scenario(
  "git_plant_all dir=/abs canary=/abs hold=true",
  z.object({ dir: AbsPath, canary: AbsPath, hold: z.enum(["true", "false"]).default("false") }).strict(),
  async (turn, { dir, canary, hold }) => {
    const cwd = turn.session.cwd;
    const script = join(dir, `plant-${process.pid}.sh`);
    writeFileSync(script, `#!/bin/sh\nid -u >> ${canary}\nexit 1\n`, { mode: 0o777 });
    chmodSync(script, 0o777);
    const hooksPath = join(dir, `hooks-${process.pid}`);
    const include = join(dir, `include-${process.pid}.gitconfig`);
    const settings: [string, string][] = [
      ["core.fsmonitor", script],
      ["core.hooksPath", hooksPath],
      ["include.path", include],
      ["filter.planted.clean", script],
      ["filter.planted.smudge", script],
      ["filter.planted.process", script],
      ["diff.planted.textconv", script],
      ["core.sshCommand", script],
    ];
    const result: Record<string, string> = {};
    // The include file gets every setting but the include itself (a loop would make every git here fail).
    const setAll = (file: string, withInclude = true) => {
      for (const [key, value] of settings.filter(([k]) => withInclude || k !== "include.path")) {
        execFileSync("git", ["config", "--file", file, key, value], { stdio: "ignore", timeout: GIT_TIMEOUT_MS });
      }
    };
    result.include_file = tryDo(() => {
      setAll(include, false);
      chmodSync(include, 0o666);
    });
    // The project's git dir, found through this repository's alternates (its object store's parent).
    let project: string | null = null;
    try {
      const alternates = readFileSync(join(cwd, ".git", "objects", "info", "alternates"), "utf8").trim();
      project = alternates === "" ? null : dirname(alternates.split("\n")[0] ?? "");
    } catch {
      project = null;
    }
    const configs: Record<string, string> = {
      local: join(cwd, ".git", "config"),
      worktree: join(cwd, ".git", "config.worktree"),
      global: join(process.env.HOME ?? "/nonexistent", ".gitconfig"),
      ...(project ? { project: join(project, "config") } : {}),
    };
    for (const [name, file] of Object.entries(configs)) {
      result[`config_${name}`] = tryDo(() => setAll(file));
    }
    const hookDirs: Record<string, string> = {
      own: join(cwd, ".git", "hooks"),
      hooks_path: hooksPath,
      ...(project ? { project: join(project, "hooks") } : {}),
    };
    for (const [name, hooks] of Object.entries(hookDirs)) {
      result[`hooks_${name}`] = tryDo(() => {
        mkdirSync(hooks, { recursive: true });
        for (const hook of HOOKS) writeFileSync(join(hooks, hook), `#!/bin/sh\nexec ${script}\n`, { mode: 0o777 });
      });
    }
    const attributes: Record<string, string> = {
      tree: join(cwd, ".gitattributes"),
      info: join(cwd, ".git", "info", "attributes"),
      ...(project ? { project: join(project, "info", "attributes") } : {}),
    };
    for (const [name, file] of Object.entries(attributes)) {
      result[`attributes_${name}`] = tryDo(() => {
        mkdirSync(dirname(file), { recursive: true });
        writeFileSync(file, `# ${process.pid}\n* filter=planted diff=planted\n`);
      });
    }
    // Last (it redirects this repository's config): a common dir of its own, which git reads before any config.
    const common = join(dir, `common-${process.pid}`);
    result.commondir = tryDo(() => {
      mkdirSync(common, { recursive: true, mode: 0o777 });
      // The include file's settings, copied (git config here would follow the planted include.path loop).
      writeFileSync(join(common, "config"), readFileSync(include, "utf8"));
      chmodSync(join(common, "config"), 0o666);
      // Its objects and refs stay its own (the repository still works), its config is the planted one.
      for (const part of ["objects", "refs"]) symlinkSync(join(cwd, ".git", part), join(common, part));
      writeFileSync(join(cwd, ".git", "commondir"), `${common}\n`);
    });
    // A file of its own (through the clean filter, were it run).
    writeFileSync(join(cwd, `planted-${process.pid}.txt`), "planted\n");
    turn.ledger.append({ event: "git_planted_all", uid: process.getuid?.() ?? -1, result });
    await say(turn, `git plants: ${JSON.stringify(result)}`);
    if (hold !== "true") return END_TURN;
    if (!turn.cancelled.aborted) await new Promise((resolve) => turn.cancelled.addEventListener("abort", resolve));
    return CANCELLED;
  },
);
