/**
 * The workspace scenarios: `edit_files` writes a change of many files into the session's cwd (the workspace
 * bench's 1,000-file change), bounded, and only below the cwd.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { readLedger } from "../../scripts/test-support/index.js";
import { MAX_EDIT_FILES } from "../src/scenarios/workspace.js";
import { type AgentUnderTest, cleanup, startAgent, tempDir } from "./harness.js";

let shared: AgentUnderTest;
let ledgerFile: string;
beforeAll(async () => {
  ledgerFile = join(tempDir(), "ledger.jsonl");
  shared = startAgent(["--ledger", ledgerFile]);
  await shared.initialize();
});
afterAll(async () => {
  expect(await shared.stop()).toEqual({ code: 0, signal: null });
  await cleanup();
});

describe("edit_files", () => {
  test("count=1000 writes 1,000 numbered files in the dir below the cwd, uncommitted, and says so in the ledger", async () => {
    const cwd = tempDir();
    const agent = await shared.session(cwd);
    expect(await agent.prompt("scenario: edit_files dir=gen/change count=1000 text=bench lines=2")).toEqual({
      stopReason: "end_turn",
    });
    const dir = join(cwd, "gen/change");
    const names = readdirSync(dir).sort();
    expect(names).toHaveLength(1000);
    expect(names[0]).toBe("f00000.txt");
    expect(names[999]).toBe("f00999.txt");
    expect(readFileSync(join(dir, "f00042.txt"), "utf8")).toBe("bench 42\nbench 42\n");
    expect(agent.messageText()).toBe("edited 1000 files in gen/change");
    expect(readLedger(ledgerFile).filter((l) => l.event === "files_edited")).toEqual([
      { event: "files_edited", dir: "gen/change", count: 1000 },
    ]);
  });

  test("the defaults write 1,000 files of one line each", async () => {
    const cwd = tempDir();
    const agent = await shared.session(cwd);
    await agent.prompt("scenario: edit_files dir=d");
    expect(readdirSync(join(cwd, "d"))).toHaveLength(1000);
    expect(readFileSync(join(cwd, "d/f00999.txt"), "utf8")).toBe("changed 999\n");
  });

  test.each([
    [`count=${MAX_EDIT_FILES + 1}`, "count"],
    ["count=0", "count"],
    ["dir=../out", "dir"],
    ["dir=/abs", "dir"],
    ["lines=101", "lines"],
  ])("%s is refused naming %s, and writes nothing", async (params, name) => {
    const cwd = tempDir();
    const agent = await shared.session(cwd);
    const line = params.startsWith("dir=") ? `scenario: edit_files ${params}` : `scenario: edit_files dir=x ${params}`;
    expect(await agent.prompt(line)).toEqual({ stopReason: "end_turn" });
    expect(agent.messageText()).toMatch(/^Invalid parameters for scenario edit_files: /);
    expect(agent.messageText()).toContain(name);
    expect(readdirSync(cwd)).toEqual([]);
    expect(existsSync(join(cwd, "..", "out"))).toBe(false);
  });
});
