/**
 * Every agent starts with a descriptor table of AGENT_FD_TABLE_SLOTS slots and
 * never holds the descriptor that sizes it (process/fd-table.ts, issue 17). Without it a
 * Node agent grows its table while loading modules, and growing a table its
 * threads share waits for an RCU grace period (12–17 ms of its start-up here).
 * With real processes: the Runner's `exec` and a script using spawnAgent, the
 * fake agent's `list_fds` or /proc/self/status reporting what the agent got.
 */
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { describe, expect, test } from "vitest";
import { REPO_ROOT } from "../../../../scripts/test-support/index.js";
import { AGENT_FD_TABLE_SLOTS, reserveAgentFdTable } from "../../src/process/fd-table.js";
import { scanInheritableFds } from "../../src/process/inherited-fds.js";
import { execArgs, makeWorkspace, writeConfig } from "../support/harness.js";

const run = promisify(execFile);
const SPAWN_JS = join(REPO_ROOT, "packages/runner/dist/process/spawn.js");
const INHERITED_FDS_JS = join(REPO_ROOT, "packages/runner/dist/process/inherited-fds.js");

describe("the agent's descriptor table", () => {
  test("the reserve is one close-on-exec descriptor at the last slot, opened once", () => {
    const fd = reserveAgentFdTable();
    expect(fd).not.toBeNull();
    expect(fd).toBeGreaterThanOrEqual(AGENT_FD_TABLE_SLOTS - 1);
    expect(reserveAgentFdTable()).toBe(fd);
    expect(scanInheritableFds()).not.toContain(fd);
  });

  test("an agent the Runner (exec) starts gets the full table and does not hold the reserve", async () => {
    const ws = makeWorkspace();
    try {
      writeConfig(ws);
      await run(process.execPath, execArgs(ws, "scenario: list_fds"));
      const entry = readFileSync(ws.ledger, "utf8")
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l))
        .find((l) => l.event === "fds");
      expect(entry.table_slots).toBeGreaterThanOrEqual(AGENT_FD_TABLE_SLOTS);
      const fds = (entry.fds as { fd: number; target: string }[]).map((f) => f.fd);
      expect(fds).toEqual(expect.arrayContaining([0, 1, 2]));
      expect(Math.max(...fds)).toBeLessThan(AGENT_FD_TABLE_SLOTS - 1);
    } finally {
      ws.cleanup();
    }
  });

  test("spawnAgent embedded in another process sizes the table at its first spawn", async () => {
    // The script first drops whatever it inherited from this test's own parent (a high descriptor there
    // would size the table by itself and hide a missing reserve).
    const script = `
      import { spawnAgent } from ${JSON.stringify(SPAWN_JS)};
      import { closeInheritedFds } from ${JSON.stringify(INHERITED_FDS_JS)};
      closeInheritedFds();
      const child = await spawnAgent({ agent: { executable: "/bin/cat", args: ["/proc/self/status"] }, cwd: "/", env: {} });
      let out = "";
      for await (const chunk of child.stdout) out += Buffer.from(chunk).toString();
      await child.terminateTree(500);
      process.stdout.write(out);`;
    const { stdout } = await run(process.execPath, ["--input-type=module", "-e", script]);
    const slots = Number(/^FDSize:\s*(\d+)$/m.exec(stdout)?.[1]);
    expect(slots).toBeGreaterThanOrEqual(AGENT_FD_TABLE_SLOTS);
  });
});
