/**
 * A Server and a Runner on this machine as child processes — the pieces
 * scripts/demo.mjs and the smokes (scripts/smoke-lib.mjs) share. Each daemon runs in its
 * own process group so a terminal Ctrl-C reaches only the script, which stops
 * them in order (Runner first, so it drains its agents, then the Server).
 */
import { execFileSync, spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const BINS = {
  server: join(ROOT, "packages", "server", "bin", "webcodex-server.js"),
  runner: join(ROOT, "packages", "runner", "bin", "webcodex-runner.js"),
  fakeAgent: join(ROOT, "fake-acp-agent", "bin", "fake-acp-agent.js"),
  cliLib: join(ROOT, "packages", "cli", "dist", "index.js"),
};

/** A TOML basic string; JSON string escapes are valid TOML escapes for what we write. */
export const toml = (value) => JSON.stringify(value);

export const sha256Hex = (text) => createHash("sha256").update(text, "utf8").digest("hex");

export const newRunnerToken = () => `wcr_${randomBytes(32).toString("base64url")}`;

export function serverConfigToml({
  host = "127.0.0.1",
  port,
  runnerId,
  runnerTokenSha256,
  projects,
  principals,
  publicUrl,
}) {
  let text = `[server]\nhost = ${toml(host)}\nport = ${port}\nstate_dir = "server"\n`;
  // OAuth for remote MCP hosts (server README, "Connect ChatGPT / Claude.ai"): public_url is the issuer.
  if (publicUrl) text += `public_url = ${toml(publicUrl)}\n\n[oauth]\nenabled = true\n`;
  text += "\n";
  text += `[[runners]]\nid = ${toml(runnerId)}\ntoken_sha256 = ${toml(runnerTokenSha256)}\nprojects = [${projects.map(toml).join(", ")}]\n`;
  for (const p of principals) {
    text += `\n[[principals]]\nid = ${toml(p.id)}\nscopes = [${p.scopes.map(toml).join(", ")}]\nprojects = [${p.projects.map(toml).join(", ")}]\n`;
  }
  return text;
}

/**
 * Node flags the daemons are launched with here, in the bench and in the
 * systemd examples: a heap cap makes V8 collect garbage early instead of
 * growing towards its default limit (measured: Runner peak RSS in a 100k-update
 * burst 161 MB without it, 119 MB with it; live heap stays ~16 MB). Hitting the
 * cap would end the daemon, so it is far above what the bounded rings need.
 *
 * V8 sizes the young generation from the old-space cap (semi-space = cap / 128
 * = 4 MB). The Runner gets V8's usual 16 MB back (`--max-semi-space-size=16`).
 * The Server keeps 4 MB: when it built one SDK Server per POST, 500 parked
 * long-polls made scavenges ~13% of its CPU at 4 MB (fan-out p99 125–150 ms),
 * so it had 16 MB too; with one SDK Server for all requests (mcp-post.ts
 * PostMux) a call allocates far less, and at 4 MB the N=50 × M=1,000 fan-out
 * cell measured p99 41 ms and peak RSS 144 MB, against 172 MB at 16 MB (the
 * young generation is committed memory whether or not it holds live objects).
 */
export const DAEMON_NODE_FLAGS = {
  server: ["--max-old-space-size=512", "--max-semi-space-size=4"],
  runner: ["--max-old-space-size=512", "--max-semi-space-size=16"],
};

/**
 * Starts `node BIN args…` in its own process group; each output line goes to
 * `onLine(line)` (stdout and stderr alike).
 */
export function startDaemon(bin, args, { cwd, env = process.env, onLine = () => {}, nodeFlags }) {
  const child = spawn(process.execPath, [...nodeFlags, bin, ...args], {
    cwd,
    env,
    stdio: ["ignore", "pipe", "pipe"],
    detached: true,
  });
  for (const stream of [child.stdout, child.stderr]) createInterface({ input: stream }).on("line", onLine);
  return child;
}

/** Starts the Server; resolves with its child and the port it reports on stdout. */
export function startServer({ configFile, cwd, env, onLine = () => {}, onSpawn = () => {} }) {
  let onListening;
  let child;
  let timer;
  const listening = new Promise((res, rej) => {
    timer = setTimeout(() => {
      killGroup(child, "SIGKILL");
      rej(new Error("the Server did not report a listening port within 30 s"));
    }, 30_000);
    onListening = (port) => {
      clearTimeout(timer);
      res(port);
    };
  });
  child = startDaemon(BINS.server, ["run", "--config", configFile], {
    nodeFlags: DAEMON_NODE_FLAGS.server,
    cwd,
    env,
    onLine: (line) => {
      if (line.startsWith('{"listening"')) {
        try {
          onListening(JSON.parse(line).port);
          return;
        } catch {}
      }
      onLine(line);
    },
  });
  onSpawn(child);
  const exited = new Promise((_, rej) =>
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      rej(new Error(`the Server exited during start-up (${signal ?? `exit code ${code}`})`));
    }),
  );
  exited.catch(() => {});
  return Promise.race([listening, exited]).then((port) => ({ child, port }));
}

export function startRunner({ configFile, cwd, env, onLine = () => {} }) {
  return startDaemon(BINS.runner, ["run", "--config", configFile], {
    nodeFlags: DAEMON_NODE_FLAGS.runner,
    cwd,
    env,
    onLine,
  });
}

/** `webcodex-server token issue … --json`; returns {token, token_id, …}. */
export function issuePrincipalToken({ configFile, cwd, principal, scopes, projects }) {
  const args = [BINS.server, "token", "issue", "--config", configFile, "--principal", principal];
  for (const s of scopes) args.push("--scope", s);
  for (const p of projects) args.push("--project", p);
  if (scopes.includes("coding_agent:run")) args.push("--allow-coding-agent-run");
  args.push("--json");
  const out = execFileSync(process.execPath, args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  const issued = JSON.parse(out.trim().split("\n").at(-1));
  if (typeof issued.token !== "string") throw new Error("webcodex-server token issue printed no token");
  return issued;
}

/** Polls the webcodex://projects resource until `projectId`'s Runner is online. */
export async function waitForRunner({ url, token, projectId, timeoutMs = 60_000, shouldStop = () => false }) {
  const { McpRunsClient } = await import(BINS.cliLib);
  const deadline = Date.now() + timeoutMs;
  let last = "no answer yet";
  while (Date.now() < deadline && !shouldStop()) {
    const client = new McpRunsClient({ url, token });
    try {
      const project = (await client.projects()).find((p) => p.project_id === projectId);
      if (project?.runner_online === true) return project;
      last = project === undefined ? "project not visible yet" : "Runner not connected yet";
    } catch (err) {
      last = err instanceof Error ? err.message : String(err);
    } finally {
      await client.close();
    }
    await new Promise((r) => setTimeout(r, 300));
  }
  if (shouldStop()) return undefined;
  throw new Error(`the Runner did not connect within ${Math.round(timeoutMs / 1000)} s (${last})`);
}

/** SIGTERM each child in order and wait for it; SIGKILL its group after `graceMs`. */
export async function stopInOrder(children, graceMs = 10_000) {
  for (const child of children) {
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) continue;
    const exited = new Promise((res) => child.once("exit", res));
    child.kill("SIGTERM");
    const timer = setTimeout(() => killGroup(child, "SIGKILL"), graceMs);
    await exited;
    clearTimeout(timer);
  }
}

/**
 * What a script that starts daemons does when the terminal ends it. `node script.mjs | tee log` and Ctrl-C: the
 * terminal's SIGINT reaches the whole foreground group, so `tee` is gone and the script's next line to stdout
 * meets a broken pipe (EPIPE). Unhandled, that error killed the script before it stopped its daemons, which
 * run in their own process groups (so Ctrl-C reaches only the script) and lived on, listening, under PID 1.
 *
 * `stop` runs once on the first of SIGINT, SIGTERM, SIGHUP or a broken stdout/stderr; after a broken pipe
 * the script's writes are dropped (`write`). If the script exits any other way, every daemon's group still
 * gets SIGKILL (`exit`). Returns the guarded writer.
 */
export function stopWithTerminal({ stop, children }) {
  let broken = false;
  let stopped = false;
  const once = (why) => {
    if (stopped) return;
    stopped = true;
    stop(why);
  };
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(signal, () => once(signal));
  for (const stream of [process.stdout, process.stderr]) {
    stream.on("error", () => {
      broken = true;
      once("EPIPE");
    });
  }
  process.on("exit", () => {
    for (const child of children()) {
      if (child !== undefined && child.exitCode === null && child.signalCode === null) killGroup(child, "SIGKILL");
    }
  });
  return {
    /** Writes `text` unless the output is gone. */
    write(stream, text) {
      if (broken) return;
      try {
        stream.write(text);
      } catch {
        broken = true;
      }
    },
  };
}

export function killGroup(child, signal) {
  try {
    process.kill(-child.pid, signal);
  } catch {
    try {
      child.kill(signal);
    } catch {}
  }
}

/** pid → {ppid, start} of every live, non-zombie process (Linux /proc; empty elsewhere). */
function processTable() {
  const table = new Map();
  let names;
  try {
    names = readdirSync("/proc").filter((n) => /^\d+$/.test(n));
  } catch {
    return table;
  }
  for (const name of names) {
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (fields[0] !== "Z") table.set(Number(name), { ppid: Number(fields[1]), start: fields[19] });
    } catch {}
  }
  return table;
}

/** Live descendants of `pid`, as pid → start time (so a reused pid is not mistaken for them). */
export function descendants(pid) {
  const table = processTable();
  const found = new Map();
  const queue = [pid];
  while (queue.length > 0) {
    const parent = queue.pop();
    for (const [child, info] of table) {
      if (info.ppid === parent && !found.has(child)) {
        found.set(child, info.start);
        queue.push(child);
      }
    }
  }
  return found;
}

/** The processes of `tracked` (pid → start time) that are still alive. */
export function survivorsOf(tracked) {
  const table = processTable();
  return [...tracked].filter(([pid, start]) => table.get(pid)?.start === start).map(([pid]) => pid);
}
