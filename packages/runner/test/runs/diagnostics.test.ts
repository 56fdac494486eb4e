/**
 * Issue 12 §4: a run's agent stderr is kept as a bounded, redacted tail in a
 * Runner-local diagnostics file (0600, under the state dir), named in the
 * Runner's log line for the failure, printed by `webcodex-runner diagnose`
 * with the run's stage and timings, and removed when retention prunes the run.
 * Real agent processes (the fake agent behind a launcher that writes stderr)
 * and the real CLI.
 */
import { execFile } from "node:child_process";
import { chmodSync, existsSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { pino } from "pino";
import { afterAll, describe, expect, test } from "vitest";
import { RUNNER_BIN as BIN, FAKE_AGENT_BIN } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";
import { prepareStore } from "../../src/commands/daemon.js";
import { STDERR_TAIL_BYTES } from "../../src/process/stderr-tail.js";
import { diagnosticsDir, diagnosticsFile } from "../../src/runs/diagnostics.js";
import { openDispatchStore } from "../../src/store/open.js";
import { makeWorkspace, newManager, runToEnd, writeConfig } from "../support/harness.js";

const SECRET = canary("env-value");
const ws = makeWorkspace();
const launcher = join(ws.dir, "noisy-agent.sh");
// Writes more than the tail bound to stderr, the mapped secret last, then becomes the fake agent.
writeFileSync(
  launcher,
  [
    "#!/bin/sh",
    `head -c ${STDERR_TAIL_BYTES * 2} /dev/zero | tr '\\0' 'x' >&2`,
    'echo "" >&2',
    'echo "agent starting with token $API_TOKEN" >&2',
    `exec ${JSON.stringify(process.execPath)} ${JSON.stringify(FAKE_AGENT_BIN)} --ledger ${JSON.stringify(ws.ledger)} "$@"`,
  ].join("\n"),
);
chmodSync(launcher, 0o755);
const config = writeConfig(ws, {
  agents: [{ id: "fake", executable: launcher, args: [], env: { PATH: "PATH", API_TOKEN: "WEBCODEX_DIAG_SECRET" } }],
});
const lines: string[] = [];
const { manager } = newManager(config, {
  store: openDispatchStore({ stateDir: config.runner.stateDir }).store,
  logger: pino({ level: "info" }, { write: (l: string) => lines.push(l) }),
  sourceEnv: { ...process.env, WEBCODEX_DIAG_SECRET: SECRET },
  diagnosticsDir: diagnosticsDir(config.runner.stateDir),
});
afterAll(async () => {
  await manager.close();
  ws.cleanup();
});

describe("run diagnostics", () => {
  test("a lost run leaves a 0600 diagnostics file with the redacted stderr tail, named in its failure log line; diagnose prints it; pruning a run removes it", async () => {
    const { run } = await runToEnd(manager, "scenario: crash_before_response");
    expect(run.state).toBe("lost");
    const file = diagnosticsFile(diagnosticsDir(config.runner.stateDir), run.run_id) as string;
    expect(existsSync(file)).toBe(true);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    const d = JSON.parse(readFileSync(file, "utf8")) as Record<string, unknown>;
    expect(d).toMatchObject({ run_id: run.run_id, state: "lost", stage: "prompt" });
    const tail = d.stderr_tail as string;
    expect(Buffer.byteLength(tail, "utf8")).toBeLessThanOrEqual(STDERR_TAIL_BYTES);
    expect(d.stderr_bytes as number).toBeGreaterThan(STDERR_TAIL_BYTES);
    expect(tail).toContain("agent starting with token [redacted]");
    expect(tail).not.toContain(SECRET);
    expect((d.timings_ms as Record<string, number>).initialize).toBeGreaterThan(0);
    // Never part of what the Server gets.
    expect(JSON.stringify(run)).not.toContain("agent starting");
    const failure = lines
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .find((l) => l.run_id === run.run_id && typeof l.diagnostics === "string");
    expect(failure?.diagnostics).toBe(file);

    const { stdout } = await promisify(execFile)(process.execPath, [
      BIN,
      "diagnose",
      "--config",
      config.file,
      run.run_id,
    ]);
    expect(stdout).toContain(`run ${run.run_id}`);
    expect(stdout).toContain("state: lost / outcome_unknown");
    expect(stdout).toContain("stage: prompt");
    expect(stdout).toMatch(/timings \(ms\): spawn [\d.]+, initialize [\d.]+/);
    expect(stdout).toContain("agent starting with token [redacted]");
    expect(stdout).not.toContain(SECRET);

    const missing = await promisify(execFile)(process.execPath, [
      BIN,
      "diagnose",
      "--config",
      config.file,
      "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa",
    ]).catch((e: { code: number; stderr: string }) => e);
    expect(missing).toMatchObject({ code: 1 });

    // Retention prunes a failed run's row (its tombstone stays) and its diagnostics file with it; a lost run's
    // row is never pruned, nor is its file.
    const failed = (await runToEnd(manager, "scenario: stop reason=max_tokens")).run;
    expect(failed.state).toBe("failed");
    const failedFile = diagnosticsFile(diagnosticsDir(config.runner.stateDir), failed.run_id) as string;
    expect(existsSync(failedFile)).toBe(true);
    await manager.close();
    const { store } = await prepareStore({
      stateDir: config.runner.stateDir,
      newStore: false,
      retention: { retainDays: 3650, retainMax: 0 },
      logger: pino({ level: "silent" }),
    });
    expect(store.tombstone(failed.run_id)).toMatchObject({ state: "failed" });
    store.close();
    expect(existsSync(failedFile)).toBe(false);
    expect(existsSync(file)).toBe(true);
  });
});
