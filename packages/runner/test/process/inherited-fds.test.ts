/**
 * Inherited file descriptors beyond the three pipes never reach the agent
 * (issue 19 §4, design §4.2). A process started with an open descriptor that
 * is not close-on-exec (a shell's `5<secret`) passes it on to every child
 * libuv spawns. The Runner's command line closes such descriptors at start;
 * a RunManager embedded elsewhere covers them with /dev/null in each agent.
 * Both with real processes: the Runner (or a script using spawnAgent) is
 * started with two extra descriptors open on secret files, and the fake
 * agent (`list_fds`) or `ls` reports what the agent holds.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { closeSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { REPO_ROOT } from "../../../../scripts/test-support/index.js";
import { scanInheritableFds } from "../../src/process/inherited-fds.js";
import { execArgs, makeWorkspace, writeConfig } from "../support/harness.js";

const SPAWN_JS = join(REPO_ROOT, "packages/runner/dist/process/spawn.js");
const dir = mkdtempSync(join(tmpdir(), "wc-fds-"));
const secretA = join(dir, "secret-a.txt");
const secretB = join(dir, "secret-b.txt");
writeFileSync(secretA, "secret a\n");
writeFileSync(secretB, "secret b\n");
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/**
 * Descriptor numbers the secrets get in the started process. High on purpose:
 * Node itself marks some low inherited descriptors close-on-exec at start-up
 * (observed up to ~17), which would hide a leak.
 */
const FD_A = 40;
const FD_B = 200;

/** Runs `args` with `node`, with secretA open at FD_A and secretB at FD_B (not close-on-exec in the child). */
function withInheritedFds(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const a = openSync(secretA, "r");
  const b = openSync(secretB, "r");
  let child: ChildProcess;
  try {
    child = spawn(process.execPath, args, {
      stdio: Array.from({ length: FD_B + 1 }, (_, fd) =>
        fd === 0 ? "ignore" : fd <= 2 ? "pipe" : fd === FD_A ? a : fd === FD_B ? b : "ignore",
      ),
    });
  } finally {
    closeSync(a);
    closeSync(b);
  }
  return new Promise((resolve) => {
    let stdout = "";
    let stderr = "";
    child.stdout?.setEncoding("utf8").on("data", (d: string) => {
      stdout += d;
    });
    child.stderr?.setEncoding("utf8").on("data", (d: string) => {
      stderr += d;
    });
    child.once("exit", (code) => resolve({ code, stdout, stderr }));
  });
}

describe("inherited descriptors", () => {
  test("descriptors Node opens itself are close-on-exec and never counted as inherited", () => {
    const fd = openSync(secretA, "r");
    try {
      expect(scanInheritableFds()).not.toContain(fd);
    } finally {
      closeSync(fd);
    }
  });

  test("the Runner (exec) closes them at start: the agent holds neither secret file", async () => {
    const ws = makeWorkspace();
    try {
      writeConfig(ws);
      const result = await withInheritedFds(execArgs(ws, "scenario: list_fds"));
      expect(result.code, result.stderr).toBe(0);
      const lines = readFileSync(ws.ledger, "utf8")
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l));
      const fds = lines.find((l) => l.event === "fds")?.fds as { fd: number; target: string }[];
      expect(fds.map((f) => f.fd)).toEqual(expect.arrayContaining([0, 1, 2]));
      expect(fds.filter((f) => f.target === secretA || f.target === secretB)).toEqual([]);
    } finally {
      ws.cleanup();
    }
  });

  test("the Runner started with node --perf-basic-prof keeps V8's perf map and isolate log open and whole", async () => {
    // V8 opens /tmp/perf-PID.map without close-on-exec; closing it at start let V8 write its later
    // lines into whichever file took the number next, and left the map without any of them.
    const ws = makeWorkspace();
    let mapFile: string | undefined;
    try {
      writeConfig(ws);
      const child = spawn(
        process.execPath,
        ["--perf-basic-prof", "--interpreted-frames-native-stack", ...execArgs(ws, "scenario: hello")],
        // In the workspace: these flags also make V8 write an isolate-*.log into its working directory.
        { stdio: ["ignore", "ignore", "pipe"], cwd: ws.dir },
      );
      mapFile = `/tmp/perf-${child.pid}.map`;
      let stderr = "";
      child.stderr?.setEncoding("utf8").on("data", (d: string) => {
        stderr += d;
      });
      const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
      expect(code, stderr).toBe(0);
      // Functions first compiled once the run is under way, long after the start-up closed descriptors.
      expect(readFileSync(mapFile, "utf8")).toMatch(/packages\/runner\/dist\/acp\/turn\.js/);
      // V8's isolate log, opened without close-on-exec too, is kept as well: it holds the lines V8 writes as the
      // process ends. Closed at start, they went into whatever file took its number (the dispatch store: corrupt).
      const logs = readdirSync(ws.dir).filter((name) => /^isolate-.*-v8\.log$/.test(name));
      expect(logs).toHaveLength(1);
      expect(readFileSync(join(ws.dir, logs[0]!), "utf8")).toMatch(/^delete,MemoryChunk,/m);
    } finally {
      if (mapFile) rmSync(mapFile, { force: true });
      ws.cleanup();
    }
  });

  test("spawnAgent in a process that still holds them covers them with /dev/null in the child", async () => {
    const script = `
      import { spawnAgent } from ${JSON.stringify(SPAWN_JS)};
      const child = await spawnAgent({ agent: { executable: "/bin/ls", args: ["-l", "/proc/self/fd/"] }, cwd: "/", env: {} });
      let out = "";
      for await (const chunk of child.stdout) out += Buffer.from(chunk).toString();
      await child.terminateTree(500);
      process.stdout.write(out);`;
    const result = await withInheritedFds(["--input-type=module", "-e", script]);
    expect(result.code, result.stderr).toBe(0);
    const targets = new Map(
      result.stdout
        .split("\n")
        .map((line) => / (\d+) -> (.*)$/.exec(line))
        .filter((m): m is RegExpExecArray => m !== null)
        .map((m) => [Number(m[1]), m[2] as string]),
    );
    expect(targets.size).toBeGreaterThanOrEqual(3);
    expect([...targets.values()]).not.toContain(secretA);
    expect([...targets.values()]).not.toContain(secretB);
    expect(targets.get(FD_A)).toBe("/dev/null");
    expect(targets.get(FD_B)).toBe("/dev/null");
  });
});
