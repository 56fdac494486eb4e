/**
 * Scenarios for the tenancy tests (issue 25 §1): an agent whose tool leaves a
 * process behind outside its process group (double fork, `setsid`), one that
 * counts what earlier runs of its OS user left running, and one that tries to
 * read another process's environment and memory, as a run of another
 * principal would; and one that leaves a private note in /tmp or reads one,
 * as files a run leaves behind would reach the next run of its OS user.
 */
import { spawn } from "node:child_process";
import { once } from "node:events";
import { closeSync, openSync, readdirSync, readFileSync, readSync, writeFileSync } from "node:fs";
import { z } from "zod";
import { END_TURN, noParams, type Scenario, say, scenario } from "../turn.js";

/** A node process that ignores SIGTERM and SIGHUP, says "ready" once it does, and never exits on its own. */
const SLEEPER_SOURCE =
  "process.on('SIGTERM', () => {}); process.on('SIGHUP', () => {}); setInterval(() => {}, 1 << 30); process.stdout.write('ready\\n');";

/** Starts a sleeper (SLEEPER_SOURCE), prints its pid once it is ready, then exits: the sleeper is orphaned. */
const DOUBLE_FORK_SOURCE = `
const { spawn } = require("node:child_process");
const child = spawn(process.execPath, ["-e", ${JSON.stringify(SLEEPER_SOURCE)}], { stdio: ["ignore", "pipe", "ignore"] });
child.stdout.once("data", () => { process.stdout.write(String(child.pid) + "\\n", () => process.exit(0)); });
`;

/** A shell that forks a copy of itself and exits, forever: each generation lives about as long as one fork. */
const HOPPER_SCRIPT = "hop() { ( hop ) & }; hop";

/** Longest an escape scenario waits for its sleeper to be ready. */
const READY_TIMEOUT_MS = 10_000;

/** First line a child writes to stdout, or a rejection when it exits or times out first. */
async function firstLine(child: ReturnType<typeof spawn>): Promise<string> {
  const stdout = child.stdout;
  if (!stdout) throw new Error("child has no stdout pipe");
  let text = "";
  const line = new Promise<string>((resolve) => {
    stdout.on("data", (chunk: Buffer) => {
      text += chunk.toString("utf8");
      const end = text.indexOf("\n");
      if (end >= 0) resolve(text.slice(0, end));
    });
  });
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      line,
      once(child, "exit").then(([code]) => Promise.reject(new Error(`child exited before its line (${code})`))),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error("child not ready in time")), READY_TIMEOUT_MS);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** Process group and session of `pid` (fields 5 and 6 of /proc/PID/stat), or nulls. */
function groupAndSession(pid: number): { pgid: number | null; sid: number | null } {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, "utf8");
    const rest = text.slice(text.lastIndexOf(")") + 2).split(" ");
    return { pgid: Number(rest[2]), sid: Number(rest[3]) };
  } catch {
    return { pgid: null, sid: null };
  }
}

/**
 * Leaves a sleeper that ignores SIGTERM and SIGHUP outside the agent's process group, as a tool that
 * daemonizes would: `how=double_fork` (a setsid'd intermediate starts it and exits, so its parent is
 * PID 1) or `how=setsid` (a child in a session of its own). Ledger `escaped` with its pid, group and
 * session once it is ready; then `end_turn`. `how=hopper` leaves a process that forks and exits over and
 * over in a session of its own (a new pid every hop, so no scan of /proc lists it twice); its ledger line has
 * no pid.
 */
export const escapeGroup: Scenario = scenario(
  "escape how=double_fork|setsid|hopper",
  z.object({ how: z.enum(["double_fork", "setsid", "hopper"]) }).strict(),
  async (turn, { how }) => {
    if (how === "hopper") {
      const hopper = spawn("/bin/sh", ["-c", HOPPER_SCRIPT], { detached: true, stdio: "ignore" });
      hopper.unref();
      turn.ledger.append({ event: "escaped", how, pid: null, agent_pid: process.pid });
      await say(turn, "Left a hopper outside the process group.");
      return END_TURN;
    }
    let pid: number;
    if (how === "setsid") {
      const child = spawn(process.execPath, ["-e", SLEEPER_SOURCE], {
        detached: true,
        stdio: ["ignore", "pipe", "ignore"],
      });
      await firstLine(child);
      child.stdout?.destroy();
      child.unref();
      pid = child.pid as number;
    } else {
      const intermediate = spawn(process.execPath, ["-e", DOUBLE_FORK_SOURCE], {
        detached: true,
        stdio: ["ignore", "pipe", "ignore"],
      });
      pid = Number(await firstLine(intermediate));
      intermediate.stdout?.destroy();
      if (intermediate.exitCode === null) await once(intermediate, "exit");
    }
    const { pgid, sid } = groupAndSession(pid);
    turn.ledger.append({ event: "escaped", how, pid, pgid, sid, agent_pid: process.pid });
    await say(turn, `Left a sleeper (${how}) outside the process group.`);
    return END_TURN;
  },
);

/** Real and effective uid (first two of the `Uid:` line) and process group of a /proc/PID entry, or null. */
function ownerOf(pid: string): { real: number; effective: number; pgid: number } | null {
  try {
    const status = readFileSync(`/proc/${pid}/status`, "utf8");
    if (/^State:\s+[ZX]/m.test(status)) return null;
    const ids = /^Uid:\s+(\d+)\s+(\d+)/m.exec(status);
    const { pgid } = groupAndSession(Number(pid));
    if (!ids || pgid === null) return null;
    return { real: Number(ids[1]), effective: Number(ids[2]), pgid };
  } catch {
    return null;
  }
}

/**
 * Counts the live processes of this agent's uid (real or effective) outside its own process group:
 * what earlier runs of the same OS user left running. Ledger `leftovers` with the uid and count.
 */
export const leftovers: Scenario = scenario("leftovers", noParams, async (turn) => {
  const uid = process.getuid?.() ?? -1;
  const ownGroup = groupAndSession(process.pid).pgid;
  let count = 0;
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const owner = ownerOf(name);
    if (owner && (owner.real === uid || owner.effective === uid) && owner.pgid !== ownGroup) count++;
  }
  turn.ledger.append({ event: "leftovers", uid, count });
  await say(turn, `leftovers: ${count}`);
  return END_TURN;
});

const errno = (error: unknown) => (error as NodeJS.ErrnoException).code ?? "error";

/** Bytes `read_process` reads from the first readable mapping of the target's memory. */
const MEM_PROBE_BYTES = 64;

/**
 * Tries to read process `pid`'s environment (and whether `env_name` is set in it) and memory (its
 * `maps`, then MEM_PROBE_BYTES of the first readable mapping through `mem`). Ledger `process_read`
 * with each outcome (`read` or the errno code, never the bytes); then `end_turn`.
 */
export const readProcess: Scenario = scenario(
  "read_process pid=1234 env_name=NAME",
  z
    .object({
      pid: z.string().regex(/^\d+$/, "must be a pid"),
      env_name: z.string().min(1).optional(),
    })
    .strict(),
  async (turn, { pid, env_name }) => {
    const result: Record<string, string | boolean> = {};
    try {
      const environ = readFileSync(`/proc/${pid}/environ`, "utf8");
      result.environ = "read";
      if (env_name !== undefined)
        result.environ_has_name = environ.split("\0").some((e) => e.startsWith(`${env_name}=`));
    } catch (error) {
      result.environ = errno(error);
    }
    let start: number | null = null;
    try {
      const maps = readFileSync(`/proc/${pid}/maps`, "utf8");
      result.maps = "read";
      const line = maps.split("\n").find((l) => /^[0-9a-f]+-[0-9a-f]+ r/.test(l));
      start = line === undefined ? null : Number.parseInt(line.split("-")[0] as string, 16);
    } catch (error) {
      result.maps = errno(error);
    }
    try {
      const fd = openSync(`/proc/${pid}/mem`, "r");
      try {
        if (start === null) result.mem = "opened";
        else result.mem = readSync(fd, Buffer.alloc(MEM_PROBE_BYTES), 0, MEM_PROBE_BYTES, start) > 0 ? "read" : "empty";
      } finally {
        closeSync(fd);
      }
    } catch (error) {
      result.mem = errno(error);
    }
    turn.ledger.append({ event: "process_read", pid: Number(pid), result });
    await say(
      turn,
      `process ${pid}: ${Object.entries(result)
        .map(([k, v]) => `${k}=${v}`)
        .join(" ")}`,
    );
    return END_TURN;
  },
);

/** Largest note `note` writes or says. */
const MAX_NOTE_BYTES = 256;

/**
 * `op=write`: leaves `text` in DIR/NAME (DIR: `dir`, default /tmp), readable by its own OS user only (0600),
 * ledger `note_written`. `op=read`: reads DIR/NAME and says what it found; ledger `note_read` with `read` or the errno code (never
 * the text).
 */
export const note: Scenario = scenario(
  "note op=write name=NAME text=TEXT",
  z
    .object({
      op: z.enum(["write", "read"]),
      name: z.string().regex(/^[A-Za-z0-9_.-]{1,64}$/, "must be 1-64 characters of [A-Za-z0-9_.-]"),
      text: z.string().max(MAX_NOTE_BYTES).optional(),
      dir: z
        .string()
        .regex(/^\/[A-Za-z0-9_./-]{0,255}$/, "must be an absolute path")
        .default("/tmp"),
    })
    .strict(),
  async (turn, { op, name, text, dir }) => {
    const path = `${dir}/${name}`;
    const uid = process.getuid?.() ?? -1;
    if (op === "write") {
      writeFileSync(path, text ?? "", { mode: 0o600 });
      turn.ledger.append({ event: "note_written", name, uid });
      await say(turn, `left a note in ${path}`);
      return END_TURN;
    }
    try {
      const found = readFileSync(path, "utf8").slice(0, MAX_NOTE_BYTES);
      turn.ledger.append({ event: "note_read", name, uid, result: "read" });
      await say(turn, `note: ${found}`);
    } catch (error) {
      turn.ledger.append({ event: "note_read", name, uid, result: errno(error) });
      await say(turn, `no note (${errno(error)})`);
    }
    return END_TURN;
  },
);
