import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { ConfigError, parseConfig } from "../src/config.js";
import { retentionOf } from "../src/daemon.js";
import { FAKE_AGENT_BIN } from "./crash-matrix-harness.js";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function config(runnerTable: string) {
  const dir = mkdtempSync(join(tmpdir(), "wc-retention-"));
  dirs.push(dir);
  mkdirSync(join(dir, "project"));
  const text = [
    "[runner]",
    runnerTable,
    "[[projects]]",
    'id = "demo"',
    'root = "project"',
    "[acp]",
    "[[acp.agents]]",
    'id = "fake"',
    `executable = ${JSON.stringify(FAKE_AGENT_BIN)}`,
  ].join("\n");
  return parseConfig(text, join(dir, "runner.toml"));
}

describe("retention settings", () => {
  it("default to 7 days and 1000 terminal rows", () => {
    expect(retentionOf(config(""))).toEqual({ retainDays: 7, retainMax: 1000 });
  });

  it("are read from [runner] retain_terminal_days / retain_terminal_max", () => {
    expect(retentionOf(config("retain_terminal_days = 2\nretain_terminal_max = 50"))).toEqual({
      retainDays: 2,
      retainMax: 50,
    });
  });

  it("reject negative or non-integer values", () => {
    expect(() => config("retain_terminal_days = -1")).toThrow(ConfigError);
    expect(() => config("retain_terminal_max = 1.5")).toThrow(/retain_terminal_max/);
  });
});
