/**
 * Scenarios for the per-run sandbox tests (issue 39 §1, §2): an agent that plants what one caller's run
 * could leave for another in the machine's shared places (a 0777 script in /tmp, files in /var/tmp and
 * /dev/shm, a 0666 System V shared-memory segment), one that looks for such plants, one that works
 * normally (temp files, git), and one that tries to make the project's git run its own code in the next
 * run (core.fsmonitor, a hook, an attribute).
 */
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { CANCELLED, END_TURN, type Scenario, say, scenario } from "../turn.js";

/** Plant tags: long random canaries from the test. */
const Tag = z.string().regex(/^[A-Za-z0-9_-]{16,96}$/, "must be 16-96 characters of [A-Za-z0-9_-]");
/** Bytes of the planted segment. */
const PLANT_SHM_BYTES = 4096;
/** Longest one git or ipcmk call of these scenarios may take. */
const TOOL_TIMEOUT_MS = 30_000;
/** Longest output of a tool kept for the ledger. */
const MAX_TOOL_OUTPUT = 512;

const errno = (error: unknown) => (error as NodeJS.ErrnoException).code ?? "error";

function plantPaths(tag: string): Record<"tmp" | "var_tmp" | "shm", string> {
  return { tmp: `/tmp/wc-plant-${tag}.sh`, var_tmp: `/var/tmp/wc-plant-${tag}`, shm: `/dev/shm/wc-plant-${tag}` };
}

/** Keys of the System V shared-memory segments this process can see (its IPC namespace's), in hex. */
function visibleShmKeys(): string[] {
  try {
    return readFileSync("/proc/sysvipc/shm", "utf8")
      .split("\n")
      .slice(1)
      .map((line) => line.trim().split(/\s+/)[0] ?? "")
      .filter((key) => key !== "")
      .map((key) => (Number(key) >>> 0).toString(16));
  } catch {
    return [];
  }
}

/** Which of a tag's plants this process sees: each path, and whether the segment `key` is listed. */
function seen(tag: string, key: string | undefined): Record<string, boolean> {
  const found: Record<string, boolean> = {};
  for (const [name, path] of Object.entries(plantPaths(tag))) found[name] = existsSync(path);
  if (key !== undefined) found.sysv_shm = visibleShmKeys().includes(key.toLowerCase());
  return found;
}

function run(file: string, args: string[], cwd?: string): { status: number | string; out: string } {
  try {
    const out = execFileSync(file, args, {
      cwd,
      encoding: "utf8",
      timeout: TOOL_TIMEOUT_MS,
      stdio: ["ignore", "pipe", "pipe"],
    });
    return { status: 0, out: out.slice(0, MAX_TOOL_OUTPUT) };
  } catch (error) {
    const e = error as { status?: number | null; stderr?: string; code?: string };
    return { status: e.status ?? e.code ?? "error", out: String(e.stderr ?? "").slice(0, MAX_TOOL_OUTPUT) };
  }
}

/**
 * Plants, for tag T: a 0777 script /tmp/wc-plant-T.sh, /var/tmp/wc-plant-T and /dev/shm/wc-plant-T (0666),
 * and a 0666 System V shared-memory segment (util-linux `ipcmk`). Ledger `planted` with the uid, the
 * segment's key (hex), and what this same process sees of them afterwards (the control). `hold=true`: then
 * waits for session/cancel (so the plants stay while another run looks), answering `cancelled`.
 */
export const plant: Scenario = scenario(
  "plant tag=TAG hold=true",
  z.object({ tag: Tag, hold: z.enum(["true", "false"]).default("false") }).strict(),
  async (turn, { tag, hold }) => {
    const paths = plantPaths(tag);
    const wrote: Record<string, string> = {};
    for (const [name, path] of Object.entries(paths)) {
      try {
        writeFileSync(path, `#!/bin/sh\necho ${tag}\n`, { mode: name === "tmp" ? 0o777 : 0o666 });
        wrote[name] = "written";
      } catch (error) {
        wrote[name] = errno(error);
      }
    }
    const ipcmk = run("ipcmk", ["-M", String(PLANT_SHM_BYTES), "-p", "0666"]);
    const id = /(\d+)\s*$/.exec(ipcmk.out.trim())?.[1];
    let key: string | null = null;
    if (id !== undefined) {
      const line = readFileSync("/proc/sysvipc/shm", "utf8")
        .split("\n")
        .find((l) => l.trim().split(/\s+/)[1] === id);
      const raw = line?.trim().split(/\s+/)[0];
      key = raw === undefined ? null : (Number(raw) >>> 0).toString(16);
    }
    const self = seen(tag, key ?? undefined);
    turn.ledger.append({ event: "planted", tag, uid: process.getuid?.() ?? -1, wrote, shm_key: key, seen: self });
    await say(turn, `planted ${tag}`);
    if (hold !== "true") return END_TURN;
    if (!turn.cancelled.aborted) await new Promise((resolve) => turn.cancelled.addEventListener("abort", resolve));
    return CANCELLED;
  },
);

/**
 * Looks for tag T's plants (and the segment `key`, hex, when given): ledger `sought` with what it sees; then
 * works as an agent does: writes, reads and removes a temp file in /tmp (ledger `temp_ok`).
 */
export const seek: Scenario = scenario(
  "seek tag=TAG key=HEX",
  z
    .object({
      tag: Tag,
      key: z
        .string()
        .regex(/^[0-9a-fA-F]{1,8}$/, "must be a hex key")
        .optional(),
    })
    .strict(),
  async (turn, { tag, key }) => {
    const found = seen(tag, key);
    let temp: string;
    try {
      const dir = mkdtempSync("/tmp/wc-agent-");
      writeFileSync(join(dir, "scratch"), tag);
      temp = readFileSync(join(dir, "scratch"), "utf8") === tag ? "ok" : "mismatch";
      rmSync(dir, { recursive: true });
    } catch (error) {
      temp = errno(error);
    }
    turn.ledger.append({ event: "sought", tag, uid: process.getuid?.() ?? -1, found, temp });
    await say(turn, `sought ${tag}`);
    return END_TURN;
  },
);

/** git with the test's repositories trusted whoever owns them (the pool users do not own the project). */
const git = (args: string[], cwd: string) => run("git", ["-c", "safe.directory=*", ...args], cwd);

/**
 * Works in the project's repository as an agent does: `git status`, a new file, `git add`, `git commit`.
 * Ledger `git_worked` with each exit status. Then `git status` once more (the step that runs a planted
 * `core.fsmonitor`).
 */
export const gitWork: Scenario = scenario(
  "git_work name=NAME",
  z.object({ name: z.string().regex(/^[A-Za-z0-9_.-]{1,64}$/, "must be 1-64 characters of [A-Za-z0-9_.-]") }).strict(),
  async (turn, { name }) => {
    const cwd = turn.session.cwd;
    const status: Record<string, number | string> = {};
    status.status = git(["status", "--porcelain"], cwd).status;
    writeFileSync(join(cwd, name), `${name}\n`);
    status.add = git(["add", name], cwd).status;
    status.commit = git(
      ["-c", "user.name=fake", "-c", "user.email=fake@example.invalid", "commit", "-q", "-m", name],
      cwd,
    ).status;
    status.status_after = git(["status", "--porcelain"], cwd).status;
    turn.ledger.append({ event: "git_worked", name, uid: process.getuid?.() ?? -1, status });
    await say(turn, `git: ${JSON.stringify(status)}`);
    return END_TURN;
  },
);

/**
 * Tries to make the project's git run `script` (written here, 0777, in the project) in a later run: sets
 * `core.fsmonitor`, adds an `include.path`, writes a `post-checkout` hook and an attributes line. Ledger
 * `git_planted` with each outcome (`ok` or why not).
 */
export const gitPlant: Scenario = scenario(
  "git_plant script=NAME canary=/abs/path",
  z
    .object({
      script: z.string().regex(/^[A-Za-z0-9_.-]{1,64}$/, "must be 1-64 characters of [A-Za-z0-9_.-]"),
      canary: z.string().regex(/^\/[A-Za-z0-9_./-]{1,255}$/, "must be an absolute path"),
    })
    .strict(),
  async (turn, { script, canary }) => {
    const cwd = turn.session.cwd;
    const scriptPath = join(cwd, script);
    writeFileSync(scriptPath, `#!/bin/sh\nid -u > ${canary}\nexit 1\n`, { mode: 0o777 });
    const result: Record<string, number | string> = {};
    result.fsmonitor = git(["config", "core.fsmonitor", scriptPath], cwd).status;
    result.include = git(["config", "include.path", join(cwd, `${script}.gitconfig`)], cwd).status;
    for (const [name, path, text] of [
      ["hook", join(cwd, ".git", "hooks", "post-checkout"), `#!/bin/sh\nexec ${scriptPath}\n`],
      ["attributes", join(cwd, ".git", "info", "attributes"), "* filter=planted\n"],
    ] as const) {
      try {
        writeFileSync(path, text, { mode: 0o777 });
        result[name] = "ok";
      } catch (error) {
        result[name] = errno(error);
      }
    }
    turn.ledger.append({ event: "git_planted", uid: process.getuid?.() ?? -1, result });
    await say(turn, `git plant: ${JSON.stringify(result)}`);
    return END_TURN;
  },
);

/** `$HOME` as this agent was given it, or null. */
const homeDir = (): string | null => process.env.HOME ?? null;

/** Whether `path` holds exactly `tag` ("canary"), something else ("other"), or the errno of reading it. */
function readTag(path: string, tag: string): string {
  try {
    return readFileSync(path, "utf8") === tag ? "canary" : "other";
  } catch (error) {
    return errno(error);
  }
}

/**
 * What one caller's run leaves in its HOME (issue 39 §1): ledger `home_probed` with the uid, HOME, USER and
 * LOGNAME as given; `write=true` first writes the canary to `$HOME/wc-home-TAG` (0644, so only the HOME's
 * own mode keeps others out); then reads `$HOME/wc-home-TAG` (what a HOME shared by the pool would show)
 * and, with `read=PATH`, that absolute path (another run's file): "canary", "other" or the errno.
 */
export const homeProbe: Scenario = scenario(
  "home_probe tag=TAG write=true read=PATH",
  z
    .object({
      tag: Tag,
      write: z.enum(["true", "false"]).default("false"),
      read: z
        .string()
        .regex(/^\/[A-Za-z0-9_./-]{1,255}$/, "must be an absolute path of [A-Za-z0-9_./-]")
        .optional(),
    })
    .strict(),
  async (turn, { tag, write, read }) => {
    const home = homeDir();
    const file = home === null ? null : join(home, `wc-home-${tag}`);
    let wrote = "no_home";
    if (file !== null && write === "true") {
      try {
        writeFileSync(file, tag, { mode: 0o644 });
        wrote = "written";
      } catch (error) {
        wrote = errno(error);
      }
    }
    turn.ledger.append({
      event: "home_probed",
      tag,
      uid: process.getuid?.() ?? -1,
      env: { HOME: home, USER: process.env.USER ?? null, LOGNAME: process.env.LOGNAME ?? null },
      file,
      wrote: write === "true" ? wrote : null,
      own: file === null ? "no_home" : readTag(file, tag),
      other: read === undefined ? null : readTag(read, tag),
    });
    await say(turn, `probed ${tag}`);
    return END_TURN;
  },
);
