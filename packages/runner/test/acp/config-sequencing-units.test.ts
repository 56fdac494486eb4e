/**
 * sequenceConfig (design §4.3 step 3) against a simulated agent: an injected
 * `set` that applies each call to a live option list and records the calls,
 * so every rule is checked without a process — call order, boolean and
 * grouped select options, each failure's kind and the option it names, and
 * the bounds of the recorded snapshot. The same rules against the fake agent
 * process are in config-sequencing.test.ts.
 */
import type { SessionConfigOption } from "@agentclientprotocol/sdk";
import { MAX_CONFIG_VALUE_LENGTH, MAX_EFFECTIVE_CONFIG_ENTRIES } from "@webcodex/protocol";
import { describe, expect, test } from "vitest";
import { type ConfigValue, checkCallerKeys, sequenceConfig, snapshotConfig } from "../../src/acp/config-sequencing.js";
import type { RequestOutcome } from "../../src/acp/session.js";

const select = (id: string, current: string, values: string[]): SessionConfigOption => ({
  type: "select",
  id,
  name: id,
  currentValue: current,
  options: values.map((value) => ({ value, name: value })),
});
const grouped = (id: string, current: string, groups: string[][]): SessionConfigOption => ({
  type: "select",
  id,
  name: id,
  currentValue: current,
  options: groups.map((values, i) => ({
    group: `g${i}`,
    name: `group ${i}`,
    options: values.map((value) => ({ value, name: value })),
  })),
});
const boolean = (id: string, current: boolean): SessionConfigOption =>
  ({ type: "boolean", id, name: id, currentValue: current }) as SessionConfigOption;

/** A live option list the `set` calls change; `sideEffect` may move other options after a set. */
function agent(
  initial: SessionConfigOption[],
  sideEffect?: (id: string, value: ConfigValue, live: Map<string, ConfigValue>) => void,
) {
  const live = new Map<string, ConfigValue>(initial.map((o) => [o.id, o.currentValue as ConfigValue]));
  const calls: [string, ConfigValue][] = [];
  const list = () => initial.map((o) => ({ ...o, currentValue: live.get(o.id) }) as SessionConfigOption);
  return {
    calls,
    initial: list(),
    set: async (id: string, value: ConfigValue): Promise<RequestOutcome<SessionConfigOption[]>> => {
      calls.push([id, value]);
      live.set(id, value);
      sideEffect?.(id, value, live);
      return { kind: "ok", value: list() };
    },
  };
}

describe("sequenceConfig", () => {
  test("applies forced keys first, then the caller's, then re-asserts a forced value a side effect moved", async () => {
    const a = agent(
      [select("mode", "code", ["ask", "code"]), select("model", "small", ["small", "big"])],
      (id, v, live) => {
        if (id === "model" && v === "big") live.set("mode", "code");
      },
    );
    const result = await sequenceConfig({
      forced: { mode: "ask" },
      caller: { model: "big" },
      allowed: ["model"],
      ...a,
    });
    expect(a.calls).toEqual([
      ["mode", "ask"],
      ["model", "big"],
      ["mode", "ask"],
    ]);
    expect(result).toEqual({
      ok: true,
      calls: 3,
      effective: [
        { id: "mode", value: "ask" },
        { id: "model", value: "big" },
      ],
      // The options as the agent last announced them: where a kept agent's next turn starts (runs/kept-agents.ts).
      live: [
        expect.objectContaining({ id: "mode", currentValue: "ask" }),
        expect.objectContaining({ id: "model", currentValue: "big" }),
      ],
    });
  });

  test("does not re-assert a forced value nothing moved", async () => {
    const a = agent([select("mode", "code", ["ask", "code"]), select("model", "small", ["small", "big"])]);
    await sequenceConfig({ forced: { mode: "ask" }, caller: { model: "big" }, allowed: ["model"], ...a });
    expect(a.calls).toEqual([
      ["mode", "ask"],
      ["model", "big"],
    ]);
  });

  test("sets a boolean option to a boolean and refuses a string for it", async () => {
    const ok = agent([boolean("web", false)]);
    expect(await sequenceConfig({ forced: {}, caller: { web: true }, allowed: ["web"], ...ok })).toMatchObject({
      ok: true,
      effective: [{ id: "web", value: true }],
    });
    const bad = agent([boolean("web", false)]);
    const refused = await sequenceConfig({ forced: {}, caller: { web: "yes" }, allowed: ["web"], ...bad });
    expect(refused).toEqual({
      ok: false,
      failureKind: "invalid_config",
      detail: 'The agent does not offer the requested value of config option "web".',
    });
    expect(bad.calls).toEqual([]);
  });

  test("finds values inside grouped select options", async () => {
    const a = agent([grouped("model", "small", [["small"], ["big", "huge"]])]);
    const result = await sequenceConfig({ forced: {}, caller: { model: "huge" }, allowed: ["model"], ...a });
    expect(result).toMatchObject({ ok: true, effective: [{ id: "model", value: "huge" }] });
    const missing = agent([grouped("model", "small", [["small"], ["big"]])]);
    expect(
      await sequenceConfig({ forced: {}, caller: { model: "huge" }, allowed: ["model"], ...missing }),
    ).toMatchObject({
      ok: false,
      failureKind: "invalid_config",
    });
  });

  test("a forced key the agent does not advertise, or whose value it does not offer, is forced_config_unsatisfied before any call", async () => {
    const a = agent([select("model", "small", ["small"])]);
    expect(await sequenceConfig({ forced: { mode: "ask" }, caller: {}, allowed: [], ...a })).toEqual({
      ok: false,
      failureKind: "forced_config_unsatisfied",
      detail: 'The agent does not advertise forced config option "mode".',
    });
    expect(await sequenceConfig({ forced: { model: "big" }, caller: {}, allowed: [], ...a })).toEqual({
      ok: false,
      failureKind: "forced_config_unsatisfied",
      detail: 'The agent does not offer the forced value of config option "model".',
    });
    expect(a.calls).toEqual([]);
  });

  test("a caller key the agent does not advertise is invalid_config naming it", async () => {
    const a = agent([select("model", "small", ["small"])]);
    expect(await sequenceConfig({ forced: {}, caller: { effort: "high" }, allowed: ["effort"], ...a })).toEqual({
      ok: false,
      failureKind: "invalid_config",
      detail: 'The agent does not advertise config option "effort".',
    });
  });

  test("an agent error names the option (not its JSON-RPC code); a set the agent did not apply is reported", async () => {
    const options = [select("model", "small", ["small", "big"])];
    const rejected = await sequenceConfig({
      forced: {},
      caller: { model: "big" },
      allowed: ["model"],
      initial: options,
      set: async () => ({ kind: "rpc_error", code: -32602 }),
    });
    expect(rejected).toEqual({
      ok: false,
      failureKind: "invalid_config",
      detail: 'The agent rejected config option "model".',
    });
    // The JSON-RPC code stays in the Runner's log; the run's message is fixed text.
    expect(JSON.stringify(rejected)).not.toContain("32602");
    const ignored = await sequenceConfig({
      forced: {},
      caller: { model: "big" },
      allowed: ["model"],
      initial: options,
      set: async () => ({ kind: "ok", value: options }),
    });
    expect(ignored).toEqual({
      ok: false,
      failureKind: "invalid_config",
      detail: 'The agent did not apply config option "model".',
    });
  });

  test("a transport fault during a set is returned as a fault, not as a config failure", async () => {
    const fault = { kind: "fault", fault: { kind: "closed" } } as unknown as RequestOutcome<SessionConfigOption[]>;
    const result = await sequenceConfig({
      forced: {},
      caller: { model: "big" },
      allowed: ["model"],
      initial: [select("model", "small", ["small", "big"])],
      set: async () => fault,
    });
    expect(result).toEqual({ ok: false, failureKind: "fault", outcome: fault });
  });

  test("a forced value that will not hold after re-assertion is forced_config_unsatisfied", async () => {
    // Every set of model moves mode back, and re-asserting mode moves model back: they cannot hold together.
    const a = agent(
      [select("mode", "ask", ["ask", "code"]), select("model", "small", ["small", "big"])],
      (id, v, live) => {
        if (id === "model" && v === "big") live.set("mode", "code");
        if (id === "mode" && v === "ask") live.set("model", "small");
      },
    );
    const result = await sequenceConfig({
      forced: { mode: "ask" },
      caller: { model: "big" },
      allowed: ["model"],
      ...a,
    });
    expect(result).toEqual({
      ok: false,
      failureKind: "invalid_config",
      detail: 'Config option "model" could not be held together with the forced configuration.',
    });
  });

  test("a forced value another forced key moves back after its own set is re-asserted, and fails if it cannot hold", async () => {
    const a = agent(
      [select("mode", "ask", ["ask", "code"]), select("model", "small", ["small", "big"])],
      (id, v, live) => {
        if (id === "model" && v === "big") live.set("mode", "code");
        if (id === "mode") live.set("model", "small");
      },
    );
    const result = await sequenceConfig({ forced: { mode: "ask", model: "big" }, caller: {}, allowed: [], ...a });
    expect(result).toEqual({
      ok: false,
      failureKind: "forced_config_unsatisfied",
      detail: 'Forced config option "mode" did not hold.',
    });
  });
});

describe("checkCallerKeys", () => {
  test("refuses a forced key and a key not allowed, naming it", () => {
    expect(checkCallerKeys({ mode: "ask" }, { mode: "code" }, ["mode"])).toEqual({
      ok: false,
      failureKind: "invalid_config",
      detail: 'Config option "mode" is forced by the operator.',
    });
    expect(checkCallerKeys({}, { colour: "blue" }, ["model"])).toEqual({
      ok: false,
      failureKind: "invalid_config",
      detail: 'Config option "colour" is not allowed for this provider.',
    });
    expect(checkCallerKeys({}, { model: "big" }, ["model"])).toEqual({ ok: true });
  });
});

describe("snapshotConfig", () => {
  test("keeps at most MAX_EFFECTIVE_CONFIG_ENTRIES entries, in the order of the ids", () => {
    const ids = Array.from({ length: MAX_EFFECTIVE_CONFIG_ENTRIES + 3 }, (_, i) => `opt_${i}`);
    const options = ids.map((id) => select(id, "v", ["v"]));
    const out = snapshotConfig(options, ids);
    expect(out).toHaveLength(MAX_EFFECTIVE_CONFIG_ENTRIES);
    expect(out.map((e) => e.id)).toEqual(ids.slice(0, MAX_EFFECTIVE_CONFIG_ENTRIES));
  });

  test("leaves out ids outside the wire pattern, ids not advertised, and values over MAX_CONFIG_VALUE_LENGTH", () => {
    const long = "x".repeat(MAX_CONFIG_VALUE_LENGTH + 1);
    const edge = "y".repeat(MAX_CONFIG_VALUE_LENGTH);
    const options = [
      select("bad id!", "v", ["v"]),
      select("long", long, [long]),
      select("edge", edge, [edge]),
      boolean("web", true),
    ];
    expect(snapshotConfig(options, ["bad id!", "missing", "long", "edge", "web"])).toEqual([
      { id: "edge", value: edge },
      { id: "web", value: true },
    ]);
  });

  test("redacts string values and measures the redacted value against the bound", () => {
    const long = "s".repeat(MAX_CONFIG_VALUE_LENGTH + 5);
    const options = [select("model", long, [long])];
    expect(snapshotConfig(options, ["model"], () => "[redacted]")).toEqual([{ id: "model", value: "[redacted]" }]);
  });
});
