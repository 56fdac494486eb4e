import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { FAKE_AGENT_BIN, IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { retentionOf, scheduleRetention } from "../../src/commands/daemon.js";
import { ConfigError, parseConfig } from "../../src/config/config.js";
import { openDispatchStore } from "../../src/store/open.js";

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

  it("are at least 1 (0 would prune every terminal row, including the ones just answered)", () => {
    expect(() => config("retain_terminal_days = 0")).toThrow(/retain_terminal_days: must be at least 1/);
    expect(() => config("retain_terminal_max = 0")).toThrow(/retain_terminal_max: must be at least 1/);
    expect(retentionOf(config("retain_terminal_days = 1\nretain_terminal_max = 1"))).toEqual({
      retainDays: 1,
      retainMax: 1,
    });
  });
});

describe("periodic retention", () => {
  it("prunes terminal rows while the Runner is up, on every interval, until stopped", async () => {
    const dir = mkdtempSync(join(tmpdir(), "wc-retention-"));
    dirs.push(dir);
    const { store } = openDispatchStore({ stateDir: dir });
    const lines: string[] = [];
    const logger = pino({ level: "info" }, { write: (l: string) => lines.push(l) });
    const stop = scheduleRetention(store, { retainDays: 7, retainMax: 1 }, logger, 20);
    try {
      const ids = ["a", "b", "c"].map((c) => `wc_agent_run_${c.repeat(26)}`);
      ids.forEach((id, i) => {
        store.admit({
          run_id: id,
          intent_fingerprint: "f".repeat(64),
          project_id: "demo",
          provider_id: "fake",
          provider_instance_id: "prov_instance_0000001",
          agent_instance_id: "agent_instance_000001",
          created_at: new Date(Date.now() - (3 - i) * 1000).toISOString(),
        });
        store.markTerminal(id, {
          state: "completed",
          execution_state: "completed",
          stop_reason: "end_turn",
          failure_kind: null,
          recovery_kind: "none",
          message: null,
          ignored_updates: 0,
          last_seq: 1,
        });
      });
      await poll(() => ids.filter((id) => store.get(id)).length <= 1, {
        timeoutMs: IN_PROCESS_WAIT_MS,
        intervalMs: 20,
        what: "the retention sweep",
      });
      expect(ids.filter((id) => store.get(id))).toHaveLength(1);
      expect(lines.some((l) => l.includes("pruned terminal runs"))).toBe(true);
    } finally {
      stop();
      store.close();
    }
  });
});
