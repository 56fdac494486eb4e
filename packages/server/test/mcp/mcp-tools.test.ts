import { MAX_OBSERVE_WAIT_SECS, MAX_PROMPT_BYTES } from "@webcodex/protocol";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { canary } from "../../../../scripts/vitest/canary.js";
import { MemoryAuditLog } from "../../src/mcp/audit.js";
import { McpTools } from "../../src/mcp/tools.js";
import { ObserveLimits } from "../../src/runs/observe-limits.js";
import { CancelToolInput, ObserveToolInput, StartToolInput } from "../../src/runs/tool-schemas.js";
import { RUN_TOOL_SPECS, RunTools, RUN_TOOL_NAMES as TOOL_NAMES } from "../../src/runs/tools.js";
import { toolDefinition } from "../../src/tools/contract.js";
import { parseToolInput } from "../../src/tools/input.js";
import { FakeRuns, principal } from "../support/fake-runs.js";

const logger = pino({ level: "silent" });
const RUN_ID = "wc_agent_run_abcdefghijklmnopqrstuvwxyz";
const validStart = { project_id: "demo", provider_id: "fake", idempotency_key: "k-1", prompt: "hi" };
const alice = principal("alice", ["coding_agent:run", "project:write"]);

function setup(limit = 8) {
  const runs = new FakeRuns();
  const audit = new MemoryAuditLog();
  const tools = new McpTools({
    runs,
    audit,
    logger,
    modules: [new RunTools({ runs, observeLimits: new ObserveLimits(limit) })],
  });
  return { runs, audit, tools };
}

function errorOf(result: { content: unknown[]; isError?: boolean | undefined }) {
  expect(result.isError).toBe(true);
  const first = result.content[0] as { type: string; text: string };
  return JSON.parse(first.text).error as { code: string; message: string; recovery_kind: string };
}

describe("tool input schemas", () => {
  const forbidden = [
    "executable",
    "args",
    "env",
    "cwd",
    "transport",
    "session_id",
    "method",
    "id",
    "jsonrpc",
    "sessionId",
  ];

  it.each(forbidden)("start_coding_agent rejects the unknown key %s by name", (key) => {
    const r = parseToolInput(StartToolInput, { ...validStart, [key]: "x" });
    expect(r.ok).toBe(false);
    if (!r.ok) {
      expect(r.error.code).toBe("invalid_input");
      expect(r.error.recovery_kind).toBe("fix_input");
      expect(r.error.message).toContain(`'${key}'`);
    }
  });

  it("names every unknown key even when required fields are missing too", () => {
    const r = parseToolInput(StartToolInput, { executable: "/bin/sh", env: { A: "1" } });
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.error.message).toMatch(/'executable'.*'env'|'env'.*'executable'/);
  });

  it.each(["id", "jsonrpc", "method", "session_id"])("observe and cancel reject %s by name", (key) => {
    for (const schema of [ObserveToolInput, CancelToolInput]) {
      const r = parseToolInput(schema, { run_id: RUN_ID, [key]: 1 });
      expect(r.ok).toBe(false);
      if (!r.ok) expect(r.error.message).toContain(`'${key}'`);
    }
  });

  it("accepts a prompt of exactly MAX_PROMPT_BYTES and rejects one byte more, counting UTF-8 bytes", () => {
    expect(parseToolInput(StartToolInput, { ...validStart, prompt: "a".repeat(MAX_PROMPT_BYTES) }).ok).toBe(true);
    const over = parseToolInput(StartToolInput, { ...validStart, prompt: "a".repeat(MAX_PROMPT_BYTES + 1) });
    expect(over.ok).toBe(false);
    if (!over.ok) expect(over.error.message).toContain(`prompt: must be at most ${MAX_PROMPT_BYTES} UTF-8 bytes`);
    // 3-byte characters: fewer characters than the byte bound, but more bytes.
    const wide = parseToolInput(StartToolInput, { ...validStart, prompt: "€".repeat(MAX_PROMPT_BYTES / 3 + 1) });
    expect(wide.ok).toBe(false);
  });

  it("accepts wait_secs up to MAX_OBSERVE_WAIT_SECS and rejects a larger or negative one at the schema", () => {
    expect(parseToolInput(ObserveToolInput, { run_id: RUN_ID, wait_secs: MAX_OBSERVE_WAIT_SECS }).ok).toBe(true);
    const r = parseToolInput(ObserveToolInput, { run_id: RUN_ID, wait_secs: MAX_OBSERVE_WAIT_SECS + 0.5 });
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.error.message).toMatch(/^wait_secs:/);
    expect(parseToolInput(ObserveToolInput, { run_id: RUN_ID, wait_secs: -1 }).ok).toBe(false);
  });

  it("rejects malformed run ids, numeric config values and out-of-range timeouts", () => {
    expect(parseToolInput(ObserveToolInput, { run_id: "run-1" }).ok).toBe(false);
    expect(parseToolInput(StartToolInput, { ...validStart, config: { model: 3 } }).ok).toBe(false);
    expect(parseToolInput(StartToolInput, { ...validStart, timeout_secs: 0 }).ok).toBe(false);
    expect(parseToolInput(StartToolInput, { ...validStart, config: { model: "x", fast: true } }).ok).toBe(true);
  });

  it("never echoes input values in the error message", () => {
    const secret = canary("project-id");
    const r = parseToolInput(StartToolInput, { ...validStart, project_id: secret });
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.error.message).not.toContain(secret);
  });

  it("never echoes the values of unknown keys, nor config keys that are not option ids, nor config values", () => {
    // Every value below carries the same random part; no error message may contain it.
    const secret = canary("input");
    const cases: Record<string, unknown>[] = [
      { ...validStart, env: { SECRET: `env-${secret}` } },
      { ...validStart, executable: `exe-${secret}`, args: [`arg-${secret}`] },
      { ...validStart, config: { [`key with spaces ${secret}`]: "v" } },
      { ...validStart, config: { model: { nested: `nested-${secret}` } } },
      { ...validStart, config: { model: 3, [`${secret}!`]: `value-${secret}` } },
      { ...validStart, config: { model: [`in-array-${secret}`] } },
    ];
    for (const input of cases) {
      const r = parseToolInput(StartToolInput, input);
      expect(r.ok).toBe(false);
      if (!r.ok) expect(r.error.message, JSON.stringify(input)).not.toContain(secret);
    }
  });

  it("cuts each unknown key name to 64 characters and names at most 8 of them", () => {
    const long = `k${"x".repeat(500)}`;
    const r = parseToolInput(StartToolInput, { ...validStart, [long]: 1 });
    expect(r.ok).toBe(false);
    if (!r.ok) {
      expect(r.error.message).toContain(`'${long.slice(0, 64)}…'`);
      expect(r.error.message).not.toContain(long.slice(0, 65));
      expect(r.error.message.length).toBeLessThan(200);
    }
    const many = Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`extra_${i}`, i]));
    const m = parseToolInput(StartToolInput, { ...validStart, ...many });
    expect(m.ok).toBe(false);
    if (!m.ok) {
      expect(m.error.message.match(/'extra_\d+'/g)).toHaveLength(8);
      expect(m.error.message).toContain("and 12 more");
    }
  });
});

describe("tools/list definitions", () => {
  it("has exactly the five run tools, each with closed input and an output schema", () => {
    const defs = RUN_TOOL_SPECS.map((s) => toolDefinition(s));
    expect(defs.map((d) => d.name).sort()).toEqual([
      "apply_coding_agent_changes",
      "cancel_coding_agent",
      "get_coding_agent_changes",
      "observe_coding_agent",
      "start_coding_agent",
    ]);
    for (const d of defs) {
      expect(d.inputSchema.type).toBe("object");
      expect((d.inputSchema as { additionalProperties?: unknown }).additionalProperties).toBe(false);
      expect(d.outputSchema?.type).toBe("object");
    }
    const start = defs.find((d) => d.name === TOOL_NAMES.start)!;
    expect(start.inputSchema.required?.sort()).toEqual(["idempotency_key", "project_id", "prompt", "provider_id"]);
    const observe = defs.find((d) => d.name === TOOL_NAMES.observe)!;
    expect(observe.inputSchema.properties?.wait_secs).toMatchObject({ maximum: MAX_OBSERVE_WAIT_SECS });
    expect(observe.outputSchema?.required).toEqual(
      expect.arrayContaining(["run_id", "state", "events", "observation_token", "history_lost", "has_more"]),
    );
  });
});

describe("McpTools.call", () => {
  it("returns structuredContent and the same JSON as text", async () => {
    const { tools } = setup();
    const result = await tools.call(alice, TOOL_NAMES.start, validStart);
    expect(result.isError).toBeUndefined();
    const text = (result.content[0] as { text: string }).text;
    expect(JSON.parse(text)).toEqual(result.structuredContent);
    expect(result.structuredContent).toMatchObject({ state: "running", replayed: false });
  });

  it("rejects an oversized prompt before the run core is called", async () => {
    const { tools, runs } = setup();
    const result = await tools.call(alice, TOOL_NAMES.start, {
      ...validStart,
      prompt: "x".repeat(MAX_PROMPT_BYTES + 1),
    });
    expect(errorOf(result).code).toBe("invalid_input");
    expect(runs.startCalls).toHaveLength(0);
  });

  it("answers an unknown provider with the project's providers (ids and names only)", async () => {
    const { tools } = setup();
    const result = await tools.call(alice, TOOL_NAMES.start, { ...validStart, provider_id: "nope" });
    const error = errorOf(result) as { code: string; message: string; available_providers?: unknown };
    expect(error.code).toBe("provider_unavailable");
    expect(error.message).toContain("fake (Fake agent)");
    expect(error.available_providers).toEqual([{ provider_id: "fake", name: "Fake agent" }]);
  });

  it("passes the run core's refusal of an ungranted project through unchanged, with nothing started", async () => {
    const { tools, runs } = setup();
    const result = await tools.call(alice, TOOL_NAMES.start, { ...validStart, project_id: "other" });
    expect(errorOf(result).code).toBe("forbidden");
    expect(runs.startCalls).toHaveLength(0);
  });

  it("limits concurrently waiting observes per principal with too_many_observers", async () => {
    const { tools, runs } = setup(1);
    const started = await tools.call(alice, TOOL_NAMES.start, validStart);
    const { run_id, observation_token } = started.structuredContent as { run_id: string; observation_token: string };
    const first = await tools.call(alice, TOOL_NAMES.observe, { run_id, after_observation_token: observation_token });
    const token = (first.structuredContent as { observation_token: string }).observation_token;
    const waiting = tools.call(alice, TOOL_NAMES.observe, { run_id, after_observation_token: token, wait_secs: 30 });
    await expect.poll(() => runs.waiting, { timeout: 10_000 }).toBe(1);
    const second = await tools.call(alice, TOOL_NAMES.observe, {
      run_id,
      after_observation_token: token,
      wait_secs: 5,
    });
    expect(errorOf(second)).toMatchObject({ code: "too_many_observers", recovery_kind: "wait" });
    // Observes without a wait are never limited.
    const quick = await tools.call(alice, TOOL_NAMES.observe, { run_id, after_observation_token: token });
    expect(quick.isError).toBeUndefined();
    // Another principal has its own budget (and gets not_found for alice's run).
    const bob = principal("bob", ["coding_agent:run"]);
    const other = await tools.call(bob, TOOL_NAMES.observe, { run_id, wait_secs: 1 });
    expect(errorOf(other).code).toBe("not_found");
    await tools.call(alice, TOOL_NAMES.cancel, { run_id });
    const woke = await waiting;
    expect((woke.structuredContent as { state: string }).state).toBe("cancelled");
    const again = await tools.call(alice, TOOL_NAMES.observe, {
      run_id,
      after_observation_token: token,
      wait_secs: 0.01,
    });
    expect(again.isError).toBeUndefined();
  });

  it("writes one audit row per call with sizes and outcome, never the prompt or tokens", async () => {
    const { tools, audit } = setup();
    const prompt = canary("prompt");
    const key = canary("idempotency-key");
    const elapsed: number[] = [];
    const timed = async <T>(call: () => Promise<T>): Promise<T> => {
      const t0 = performance.now();
      const result = await call();
      elapsed.push(performance.now() - t0);
      return result;
    };
    const started = await timed(() =>
      tools.call(alice, TOOL_NAMES.start, { ...validStart, idempotency_key: key, prompt: `do it ${prompt}` }),
    );
    const { run_id, observation_token } = started.structuredContent as { run_id: string; observation_token: string };
    await timed(() => tools.call(alice, TOOL_NAMES.observe, { run_id, after_observation_token: observation_token }));
    await timed(() =>
      tools.call(alice, TOOL_NAMES.start, { ...validStart, idempotency_key: key, executable: "/bin/sh" }),
    );
    expect(audit.rows.map((r) => [r.tool, r.outcome, r.run_id])).toEqual([
      ["start_coding_agent", "ok", run_id],
      ["observe_coding_agent", "ok", run_id],
      ["start_coding_agent", "invalid_input", null],
    ]);
    for (const [i, row] of audit.rows.entries()) {
      expect(row.input_bytes).toBeGreaterThan(0);
      expect(row.output_bytes).toBeGreaterThan(0);
      // The duration of that very call: never negative, never longer than the caller waited for it.
      expect(row.duration_ms).toBeGreaterThanOrEqual(0);
      expect(row.duration_ms).toBeLessThanOrEqual(Math.ceil(elapsed[i] ?? 0));
    }
    const dump = JSON.stringify(audit.rows);
    expect(dump).not.toContain(prompt);
    expect(dump).not.toContain(observation_token);
    expect(dump).not.toContain(key);
  });
});

describe("a run core that throws", () => {
  // The run core is replaced here (FakeRuns with a throwing method) because the real one has no input
  // that makes it throw; this is the front end's last line of defence for a bug behind it.
  const SECRET = `${canary("internal")}-/home/alice/.ssh/id_ed25519`;
  const calls = [
    ["start", TOOL_NAMES.start, validStart],
    ["observe", TOOL_NAMES.observe, { run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa" }],
    ["cancel", TOOL_NAMES.cancel, { run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa" }],
  ] as const;

  it.each(calls)(
    "%s answers `internal` without the thrown message, in the result, the audit row or the log",
    async (method, tool, args) => {
      const runs = new FakeRuns();
      Object.assign(runs, { [method]: () => Promise.reject(new Error(`database exploded at ${SECRET}`)) });
      const audit = new MemoryAuditLog();
      const lines: string[] = [];
      const log = pino({ level: "debug" }, { write: (line: string) => lines.push(line) });
      const tools = new McpTools({
        runs,
        audit,
        logger: log,
        modules: [new RunTools({ runs, observeLimits: new ObserveLimits(8) })],
      });
      const result = await tools.call(alice, tool, args);
      const error = errorOf(result);
      expect(error).toMatchObject({ code: "internal", recovery_kind: "none" });
      expect(error.message).toContain("Retrying it is safe");
      expect(JSON.stringify(result)).not.toContain("exploded");
      expect(audit.rows.map((r) => [r.tool, r.outcome])).toEqual([[tool, "internal"]]);
      expect(lines.some((l) => l.includes("tool call failed unexpectedly"))).toBe(true);
      for (const text of [JSON.stringify(result), JSON.stringify(audit.rows), lines.join("\n")]) {
        expect(text).not.toContain(SECRET);
      }
    },
  );
});

describe("one definition of a run's status in tool outputs", () => {
  it("observe's output and an agent task attempt's run outcome both extend RunStatusFields", async () => {
    const { ObserveToolOutput, RunStatusFields } = await import("../../src/runs/tool-schemas.js");
    const { ReconcileOutput, RunChainFields } = await import("@webcodex/protocol");
    const status = Object.keys(RunStatusFields.shape);
    expect(status).toEqual([
      "run_id",
      "state",
      "execution_state",
      "stop_reason",
      "failure_kind",
      "recovery_kind",
      "message",
      "usage",
    ]);
    expect(Object.keys(ObserveToolOutput.shape).slice(0, status.length)).toEqual(status);
    const attempt = ReconcileOutput.shape.attempt.unwrap();
    const run = attempt.shape.run.unwrap();
    const chain = Object.keys(RunChainFields);
    expect(chain).toEqual(["parent_run_id", "continued_by"]);
    expect(Object.keys(run.shape)).toEqual([...status, "reconciled_at", ...chain]);
    for (const key of status)
      expect(run.shape[key as keyof typeof run.shape]).toBe(
        RunStatusFields.shape[key as keyof typeof RunStatusFields.shape],
      );
    // The chain, too, is one definition: the same schemas in observe's output and in an attempt's run.
    for (const key of chain) {
      const field = RunChainFields[key as keyof typeof RunChainFields];
      expect(run.shape[key as keyof typeof run.shape]).toBe(field);
      expect(ObserveToolOutput.shape[key as keyof typeof ObserveToolOutput.shape]).toBe(field);
    }
  });
});
