/** `check --probe` internals: initialize + session/new only, tree cleaned up, failures name the stage. */
import { afterAll, expect, test } from "vitest";
import { readLedger } from "../../../../scripts/test-support/index.js";
import { probeAgent } from "../../src/commands/probe.js";
import { makeWorkspace, writeConfig } from "../support/harness.js";

const ws = makeWorkspace();
const config = writeConfig(ws, {
  agents: [
    { id: "fake", args: ["--ledger", ws.ledger, "--config-options", "model"] },
    { id: "exit-init", args: ["--ledger", ws.ledger, "--exit-during-initialize"] },
    { id: "no-env", env: { PATH: "PATH", KEY: "WC_PROBE_TEST_UNSET" } },
  ],
});
afterAll(() => ws.cleanup());
const agent = (id: string) => config.acp.agents.find((a) => a.id === id)!;
const project = config.projects[0]!;

test("a probe reports what the agent advertises and never sends a prompt", async () => {
  const result = await probeAgent({ agent: agent("fake"), project, timeoutSecs: 10, graceMs: 300 });
  expect(result.ok).toBe(true);
  if (!result.ok) return;
  expect(result.initialize.protocolVersion).toBe(1);
  expect(result.session.configOptions?.map((o) => o.id)).toEqual(["model"]);
  expect(readLedger(ws.ledger).filter((e) => e.event === "prompt")).toEqual([]);
});

test("probe failures name the stage", async () => {
  expect(await probeAgent({ agent: agent("exit-init"), project, timeoutSecs: 10, graceMs: 300 })).toMatchObject({
    ok: false,
    stage: "initialize",
  });
  expect(await probeAgent({ agent: agent("no-env"), project, timeoutSecs: 10, graceMs: 300 })).toMatchObject({
    ok: false,
    stage: "spawn",
    reason: expect.stringContaining("WC_PROBE_TEST_UNSET"),
  });
});
