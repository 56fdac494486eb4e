/**
 * design §4.3 step 3 against the fake agent's live config options (mode,
 * model, reasoning_effort; model=fake-large flips mode to code; -32602 on an
 * unknown id or value). Every violation is failed / not_started / fix_input
 * and no prompt reaches the agent.
 */
import { createHash } from "node:crypto";
import { afterAll, describe, expect, test } from "vitest";
import { readLedger } from "../../../../scripts/test-support/index.js";
import { makeWorkspace, newManager, runToEnd, writeConfig } from "../support/harness.js";

const ws = makeWorkspace();
const args = (options: string) => ["--ledger", ws.ledger, "--config-options", options];
const sha = (text: string) => createHash("sha256").update(text, "utf8").digest("hex");

// Unforced Runner: callers may set model, reasoning_effort, mode and a key the agent does not advertise.
const open = newManager(
  writeConfig(ws, {
    agents: [
      {
        id: "fake",
        args: args("mode,model,reasoning_effort"),
        allowed: ["model", "reasoning_effort", "mode", "temperature"],
      },
    ],
  }),
);
// Forced mode=ask; callers may set model.
const forced = newManager(
  writeConfig(ws, {
    forced: { mode: "ask" },
    agents: [
      { id: "fake", args: args("mode,model,reasoning_effort"), allowed: ["model"] },
      { id: "no-mode", args: args("model"), allowed: ["model"] },
    ],
  }),
);

// Forced mode=ask and model=fake-large: forcing model flips mode to code, which must be re-asserted.
const forcedPair = newManager(
  writeConfig(ws, {
    forced: { mode: "ask", model: "fake-large" },
    agents: [{ id: "fake", args: args("mode,model,reasoning_effort"), allowed: ["reasoning_effort"] }],
  }),
);

afterAll(async () => {
  await open.manager.close();
  await forced.manager.close();
  await forcedPair.manager.close();
  ws.cleanup();
});

const dispatched = (prompt: string) =>
  readLedger(ws.ledger).filter((e) => e.event === "prompt" && e.prompt_sha256 === sha(prompt)).length;

/** The set_config_option calls, in arrival order, of the agent process that received `prompt`. */
function configCalls(prompt: string): [string, string][] {
  const ledger = readLedger(ws.ledger);
  const pid = ledger.find((e) => e.event === "prompt" && e.prompt_sha256 === sha(prompt))?.pid;
  if (pid === undefined) throw new Error("the prompt never reached the agent");
  return ledger
    .filter((e) => e.event === "set_config_option" && e.pid === pid)
    .map((e) => [String(e.config_id), String(e.value)]);
}

interface Case {
  name: string;
  forced?: boolean | "pair";
  provider?: string;
  config: Record<string, string | boolean>;
  ok: boolean;
  failure?: "invalid_config" | "forced_config_unsatisfied";
  effective?: Record<string, string>;
  /** The session/set_config_option calls the agent received, in order: forced keys first, then the caller's. */
  calls?: [string, string][];
  message?: RegExp;
}

const cases: Case[] = [
  {
    name: "valid override",
    config: { model: "fake-large", reasoning_effort: "high" },
    ok: true,
    // Every advertised option is recorded, mode too (model=fake-large moved it as a side effect).
    effective: { model: "fake-large", reasoning_effort: "high", mode: "code" },
    calls: [
      ["model", "fake-large"],
      ["reasoning_effort", "high"],
    ],
  },
  {
    name: "no caller config sends no calls",
    config: {},
    ok: true,
    // The agent's own current values are still the run's effective config.
    effective: { mode: "ask", model: "fake-small", reasoning_effort: "medium" },
    calls: [],
  },
  {
    name: "value not advertised",
    config: { model: "fake-huge" },
    ok: false,
    failure: "invalid_config",
    message: /"model"/,
  },
  {
    name: "id not advertised by the agent",
    config: { temperature: "hot" },
    ok: false,
    failure: "invalid_config",
    message: /"temperature"/,
  },
  { name: "key not allowed", config: { colour: "blue" }, ok: false, failure: "invalid_config", message: /not allowed/ },
  { name: "boolean for a select option", config: { model: true }, ok: false, failure: "invalid_config" },
  {
    name: "forced conflict",
    forced: true,
    config: { mode: "code" },
    ok: false,
    failure: "invalid_config",
    message: /forced/,
  },
  {
    name: "forced value re-asserted after a side effect",
    forced: true,
    config: { model: "fake-large" },
    ok: true,
    effective: { mode: "ask", model: "fake-large", reasoning_effort: "medium" },
    // Forced first, then the caller's key, then the forced value its side effect moved.
    calls: [
      ["mode", "ask"],
      ["model", "fake-large"],
      ["mode", "ask"],
    ],
  },
  {
    name: "a forced value moved by another forced key is re-asserted (no caller config)",
    forced: "pair",
    config: {},
    ok: true,
    effective: { mode: "ask", model: "fake-large", reasoning_effort: "medium" },
    calls: [
      ["mode", "ask"],
      ["model", "fake-large"],
      ["mode", "ask"],
    ],
  },
  {
    name: "forced key not advertised by the provider",
    forced: true,
    provider: "no-mode",
    config: {},
    ok: false,
    failure: "forced_config_unsatisfied",
    message: /"mode"/,
  },
];

describe("config sequencing", () => {
  test.each(cases)("$name", async (c) => {
    const { manager } = c.forced === "pair" ? forcedPair : c.forced ? forced : open;
    const prompt = `scenario: hello\ncase: config ${c.name}`;
    const { run } = await runToEnd(manager, prompt, { config: c.config, provider_id: c.provider ?? "fake" });
    if (c.ok) {
      expect(run.state).toBe("completed");
      expect(Object.fromEntries(run.effective_config.map((e) => [e.id, e.value]))).toEqual(c.effective);
      expect(dispatched(prompt)).toBe(1);
      expect(configCalls(prompt)).toEqual(c.calls);
    } else {
      expect(run).toMatchObject({
        state: "failed",
        execution_state: "not_started",
        failure_kind: c.failure,
        recovery_kind: "fix_input",
      });
      expect(run.message).toMatch(/Stage: set_config_option\./);
      if (c.message) expect(run.message).toMatch(c.message);
      expect(dispatched(prompt)).toBe(0);
    }
  });
});
