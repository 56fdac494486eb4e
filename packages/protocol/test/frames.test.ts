import fc from "fast-check";
import { describe, expect, it, vi } from "vitest";
import { canary } from "../../../scripts/vitest/canary.js";
import {
  CAPACITY_REASONS,
  type CapacityReason,
  encodeFrame,
  MAX_FRAME_BYTES,
  MAX_PROMPT_BYTES,
  PROTOCOL_VERSION,
  PROTOCOL_VERSION_MISMATCH,
  parseRunnerFrame,
  parseServerFrame,
  type RunnerFrame,
  type RunSummary,
  type ServerFrame,
} from "../src/index.js";

const RUN_ID = "wc_agent_run_abcdefghijklmnopqrstuvwxyz";
const INSTANCE = "inst_0123456789abcdef";
const FP = "a".repeat(64);

const summary: RunSummary = {
  run_id: RUN_ID,
  intent_fingerprint: FP,
  project_id: "demo",
  provider_id: "fake",
  provider_instance_id: INSTANCE,
  agent_instance_id: INSTANCE,
  phase: "dispatch_barrier",
  state: "running",
  execution_state: "started",
  stop_reason: null,
  failure_kind: null,
  recovery_kind: "wait",
  message: null,
  effective_config: [{ id: "model", value: "fake-small" }],
  ignored_updates: 0,
  last_seq: 2,
  oldest_seq: 1,
  created_at: "2026-11-29T21:00:00.000Z",
  updated_at: "2026-11-29T21:00:01.000Z",
};

const at = "2026-11-29T21:00:00.000Z";

const runnerFrames: RunnerFrame[] = [
  {
    type: "hello",
    protocol_version: PROTOCOL_VERSION,
    agent_instance_id: INSTANCE,
    store_id: INSTANCE,
    capabilities: { coding_agent_run: { max_concurrent_runs: 2 } },
    providers: [
      { provider_id: "fake", provider_instance_id: INSTANCE, name: "Fake", allowed_config_options: ["model"] },
    ],
    projects: [{ project_id: "demo", allow_patch: true }],
    inventory: [summary],
  },
  { type: "run.start.result", request_id: "r1", run: summary, created: true },
  {
    type: "run.sync.result",
    request_id: "r2",
    run: summary,
    events: [
      { seq: 1, at, kind: "agent_message", text: "hi", truncated: false },
      { seq: 2, at, kind: "reasoning", text: "hmm", truncated: false },
      { seq: 3, at, kind: "plan", entries: [{ content: "a", status: "pending", priority: "high" }], truncated: false },
      { seq: 4, at, kind: "tool_activity", tool_call_id: "t1", title: "Edit", tool_kind: "edit", status: "completed" },
      { seq: 5, at, kind: "file_change", tool_call_id: "t1", path: "src/a.ts" },
      { seq: 6, at, kind: "terminal_activity", tool_call_id: "t2", terminal_id: "term-1" },
      { seq: 7, at, kind: "usage", used_tokens: 10, context_size: 100, cost_amount: 0.5, cost_currency: "USD" },
      {
        seq: 8,
        at,
        kind: "permission_request",
        tool_call_id: "t3",
        title: "Run rm",
        options: [{ option_id: "o1", name: "Allow", kind: "allow_once" }],
      },
      {
        seq: 9,
        at,
        kind: "terminal",
        state: "completed",
        execution_state: "completed",
        stop_reason: "end_turn",
        failure_kind: null,
        message: "done",
      },
    ],
    has_more: false,
  },
  { type: "run.cancel.result", request_id: "r3", run: summary, cancel_requested: true, already_terminal: false },
  { type: "run.update", run: summary, events: [] },
  { type: "error", request_id: "r5", code: "capacity", message: "full" },
  { type: "heartbeat", sent_at: at },
  { type: "protocol_error", code: "invalid_frame", message: "bad" },
];

const serverFrames: ServerFrame[] = [
  {
    type: "hello.ack",
    runner_id: "local",
    server_instance_id: INSTANCE,
    heartbeat_interval_ms: 15000,
    resume_secret: "resume_secret_for_tests_0000000000000000000",
  },
  {
    type: "run.start",
    request_id: "r1",
    run_id: RUN_ID,
    intent_fingerprint: FP,
    project_id: "demo",
    provider_id: "fake",
    agent_instance_id: INSTANCE,
    provider_instance_id: INSTANCE,
    prompt: "Say hello.",
    config: { model: "fake-small", verbose: true },
    timeout_secs: 60,
  },
  { type: "run.sync", request_id: "r2", run_id: RUN_ID, after_seq: 0, max_events: 100 },
  { type: "run.cancel", request_id: "r3", run_id: RUN_ID },
  { type: "heartbeat", sent_at: at },
  { type: "protocol_error", code: "replaced", message: "a newer connection replaced this one" },
];

describe("frame round trip", () => {
  it.each(runnerFrames.map((f) => [f.type, f] as const))("Runner frame %s survives encode → parse", (_t, frame) => {
    const parsed = parseRunnerFrame(encodeFrame(frame));
    expect(parsed).toEqual({ ok: true, frame });
  });
  it.each(serverFrames.map((f) => [f.type, f] as const))("Server frame %s survives encode → parse", (_t, frame) => {
    const parsed = parseServerFrame(encodeFrame(frame));
    expect(parsed).toEqual({ ok: true, frame });
  });
  it("hello states whether the Runner's agents share its user as a boolean, and may leave it out (older Runners)", () => {
    const hello = runnerFrames[0]!;
    expect(parseRunnerFrame(withField(hello, [], "agents_share_runner_user", true))).toMatchObject({ ok: true });
    expect(parseRunnerFrame(JSON.stringify(hello))).toMatchObject({ ok: true });
    const bad = parseRunnerFrame(withField(hello, [], "agents_share_runner_user", "yes"));
    expect(bad.ok).toBe(false);
    if (!bad.ok) expect(bad.error.message).toContain("agents_share_runner_user");
  });
  it("refuses a hello of another link protocol, telling the operator to run one release on both sides", () => {
    const older = parseRunnerFrame(withField(runnerFrames[0]!, [], "protocol_version", PROTOCOL_VERSION - 1));
    expect(older).toEqual({
      ok: false,
      error: {
        code: "invalid_frame",
        path: "protocol_version",
        message: `protocol_version: ${PROTOCOL_VERSION_MISMATCH}`,
      },
    });
    expect(PROTOCOL_VERSION_MISMATCH).toContain(`protocol ${PROTOCOL_VERSION}`);
  });
  it("does not accept a Server frame on the Runner's direction", () => {
    const result = parseRunnerFrame(JSON.stringify(serverFrames[1]));
    expect(result.ok).toBe(false);
  });
});

function withField(frame: object, path: (string | number)[], key: string, value: unknown): string {
  const copy = structuredClone(frame) as Record<string, unknown>;
  let target: Record<string, unknown> = copy;
  for (const p of path) target = target[p] as Record<string, unknown>;
  target[key] = value;
  return JSON.stringify(copy);
}

describe("forbidden fields are rejected by name", () => {
  const hello = runnerFrames[0]!;
  const start = serverFrames[1]!;
  const cases: Array<[string, string, (string | number)[], string, unknown, "runner" | "server"]> = [
    [
      "a provider's executable path",
      "providers[0].executable",
      ["providers", 0],
      "executable",
      "/usr/bin/codex",
      "runner",
    ],
    ["a provider's argv", "providers[0].args", ["providers", 0], "args", ["--yolo"], "runner"],
    ["a provider's env", "providers[0].env", ["providers", 0], "env", { OPENAI_API_KEY: "x" }, "runner"],
    ["a project's root path", "projects[0].root", ["projects", 0], "root", "/home/me/repo", "runner"],
    ["a run's pid", "inventory[0].pid", ["inventory", 0], "pid", 4242, "runner"],
    ["a run's ACP session id", "inventory[0].session_id", ["inventory", 0], "session_id", "s-1", "runner"],
    ["raw JSON-RPC on hello", "jsonrpc", [], "jsonrpc", "2.0", "runner"],
    ["a JSON-RPC method on run.start", "method", [], "method", "session/prompt", "server"],
    ["a JSON-RPC id on run.start", "id", [], "id", 7, "server"],
    ["a cwd on run.start", "cwd", [], "cwd", "/tmp", "server"],
    ["an executable on run.start", "executable", [], "executable", "/bin/sh", "server"],
    ["an env on run.start", "env", [], "env", { A: "b" }, "server"],
  ];
  it.each(cases)("rejects %s", (_name, expectedPath, path, key, value, dir) => {
    const text = withField(dir === "runner" ? hello : start, path, key, value);
    const result = dir === "runner" ? parseRunnerFrame(text) : parseServerFrame(text);
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.error.code).toBe("invalid_frame");
    expect(result.error.path).toBe(expectedPath);
    expect(result.error.message).toContain(expectedPath);
  });

  it("never echoes the rejected value in the error", () => {
    const secret = canary("env-value");
    const text = withField(hello, ["providers", 0], "env", { SECRET: secret });
    const result = parseRunnerFrame(text);
    expect(JSON.stringify(result)).not.toContain(secret);
  });

  it("rejects integer config values (string/select and boolean only)", () => {
    const text = withField(start, ["config"], "model", 3);
    const result = parseServerFrame(text);
    expect(result.ok).toBe(false);
    if (!result.ok) expect(result.error.path).toBe("config.model");
  });

  it("rejects a prompt over the 64 KiB bound", () => {
    const text = withField(start, [], "prompt", "x".repeat(MAX_PROMPT_BYTES + 1));
    const result = parseServerFrame(text);
    expect(result.ok).toBe(false);
    if (!result.ok) expect(result.error.path).toBe("prompt");
  });

  it("counts the prompt bound in UTF-8 bytes, not characters", () => {
    const text = withField(start, [], "prompt", "é".repeat(MAX_PROMPT_BYTES / 2 + 1));
    expect(parseServerFrame(text).ok).toBe(false);
    expect(parseServerFrame(withField(start, [], "prompt", "é".repeat(MAX_PROMPT_BYTES / 2))).ok).toBe(true);
  });

  it("rejects a malformed run id", () => {
    const result = parseServerFrame(withField(start, [], "run_id", "wc_agent_run_UPPER"));
    expect(result.ok).toBe(false);
    if (!result.ok) expect(result.error.path).toBe("run_id");
  });
});

describe("hostile input", () => {
  it("rejects an unknown frame type", () => {
    const result = parseRunnerFrame(JSON.stringify({ type: "run.exec_shell", cmd: "rm -rf /" }));
    expect(result.ok).toBe(false);
    if (!result.ok) expect(result.error.code).toBe("invalid_frame");
  });
  it("rejects non-JSON and non-object JSON", () => {
    for (const text of ["", "{", "null", "[]", "42", '"hello"', "\u0000\u0001"]) {
      const result = parseRunnerFrame(text);
      expect(result.ok).toBe(false);
    }
  });
  it("rejects a non-string input", () => {
    expect(parseRunnerFrame(Buffer.from("{}")).ok).toBe(false);
  });
  it("rejects oversized text before parsing it", () => {
    const huge = `{"type":"heartbeat","sent_at":"${"x".repeat(100 * 1024 * 1024)}"}`;
    const parse = vi.spyOn(JSON, "parse");
    try {
      const result = parseRunnerFrame(huge);
      expect(result).toMatchObject({ ok: false, error: { code: "frame_too_large" } });
      // Refused by its size: never parsed.
      expect(parse).not.toHaveBeenCalled();
    } finally {
      parse.mockRestore();
    }
  });
  it("rejects multi-byte text whose UTF-8 size exceeds the frame cap", () => {
    const text = `{"type":"heartbeat","sent_at":"${"€".repeat(MAX_FRAME_BYTES / 3 + 10)}"}`;
    expect(text.length).toBeLessThan(MAX_FRAME_BYTES);
    expect(parseRunnerFrame(text)).toMatchObject({ ok: false, error: { code: "frame_too_large" } });
  });
  it("rejects deep nesting without recursing into it", () => {
    const deep = `${"[".repeat(200_000)}${"]".repeat(200_000)}`;
    expect(parseRunnerFrame(deep)).toMatchObject({ ok: false, error: { code: "too_deep" } });
    const deepObj = `{"type":"heartbeat","sent_at":${'{"a":'.repeat(50)}1${"}".repeat(50)}}`;
    expect(parseRunnerFrame(deepObj)).toMatchObject({ ok: false, error: { code: "too_deep" } });
  });
  it("does not count brackets inside strings as nesting", () => {
    const frame = { type: "heartbeat", sent_at: "[[[[[[[[[[[[[[[[[[[[[[[[" } as const;
    expect(parseRunnerFrame(JSON.stringify(frame)).ok).toBe(true);
  });
  it("encodeFrame refuses to produce a frame the peer would reject", () => {
    const big = { type: "heartbeat", sent_at: "x".repeat(MAX_FRAME_BYTES) } as const;
    expect(() => encodeFrame(big)).toThrow(RangeError);
  });

  it("never throws on arbitrary strings", () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 2000 }), (text) => {
        const a = parseRunnerFrame(text);
        const b = parseServerFrame(text);
        return a.ok === false && b.ok === false;
      }),
      { numRuns: 500 },
    );
  });

  it("never throws on arbitrary JSON values and accepts none that break the schema", () => {
    // Random JSON is never a valid frame (no generated object has a frame's required keys and types).
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 6 }), (value) => {
        const result = parseRunnerFrame(JSON.stringify(value));
        expect(result.ok).toBe(false);
        if (result.ok) return false;
        expect(["invalid_frame", "invalid_json", "too_deep", "frame_too_large"]).toContain(result.error.code);
        return true;
      }),
      { numRuns: 500 },
    );
  });

  it("round-trips valid frames with arbitrary request ids and text through encode → parse unchanged", () => {
    const requestId = fc.stringMatching(/^[A-Za-z0-9_-]{1,64}$/);
    const withRequestIds = runnerFrames.filter((f) => "request_id" in f);
    expect(withRequestIds.length).toBeGreaterThan(2);
    fc.assert(
      fc.property(fc.constantFrom(...withRequestIds), requestId, fc.string({ maxLength: 200 }), (frame, id, text) => {
        const varied = { ...frame, request_id: id } as RunnerFrame;
        const result = parseRunnerFrame(encodeFrame(varied));
        expect(result).toEqual({ ok: true, frame: varied });
        // Arbitrary text in a free-text field survives too (the error frame's message).
        const error = { type: "error", request_id: id, code: "internal", message: text } as RunnerFrame;
        const parsedError = parseRunnerFrame(encodeFrame(error));
        if (!parsedError.ok) return text.length === 0; // an empty message may be refused; nothing else
        expect(parsedError.frame).toEqual(error);
        return true;
      }),
      { numRuns: 300 },
    );
  });

  it("rejects random mutations of valid frames with a typed error, never a throw", () => {
    const keys = ["type", "run", "events", "request_id", "prompt", "config", "providers", "extra", "pid"];
    const values = fc.oneof(fc.string(), fc.integer(), fc.boolean(), fc.constant(null), fc.array(fc.integer()));
    fc.assert(
      fc.property(fc.constantFrom(...runnerFrames), fc.constantFrom(...keys), values, (frame, key, value) => {
        const mutated = { ...frame, [key]: value } as Record<string, unknown>;
        const result = parseRunnerFrame(JSON.stringify(mutated));
        if (result.ok) {
          // Still a valid frame (e.g. a string request_id): it must be exactly what was sent.
          expect(result.frame).toEqual(mutated);
          return true;
        }
        expect(["invalid_frame", "invalid_json", "too_deep", "frame_too_large"]).toContain(result.error.code);
        expect(typeof result.error.message).toBe("string");
        return true;
      }),
      { numRuns: 500 },
    );
  });
});

describe("capacity_reason on an error frame", () => {
  const error = { type: "error", request_id: "req_1", code: "capacity", message: "full" };
  it("is accepted on capacity, from the closed set only", () => {
    for (const reason of Object.keys(CAPACITY_REASONS)) {
      expect(parseRunnerFrame(JSON.stringify({ ...error, capacity_reason: reason }))).toMatchObject({ ok: true });
    }
    expect(parseRunnerFrame(JSON.stringify(error))).toMatchObject({ ok: true });
    const unknown = parseRunnerFrame(JSON.stringify({ ...error, capacity_reason: "because" }));
    expect(unknown).toMatchObject({ ok: false, error: { code: "invalid_frame", path: "capacity_reason" } });
  });
  it("is refused on any other code", () => {
    const other = parseRunnerFrame(
      JSON.stringify({ ...error, code: "internal", capacity_reason: "runner_full" satisfies CapacityReason }),
    );
    expect(other).toMatchObject({ ok: false, error: { code: "invalid_frame", path: "capacity_reason" } });
  });
});

describe("run.apply and its answer", () => {
  const head = "b".repeat(40);
  const apply = {
    run_id: RUN_ID,
    target_branch: "main",
    result: "fast_forward",
    applied: true,
    head_commit: head,
    target_before: "c".repeat(40),
    target_after: head,
  };
  const ask = { type: "run.apply", request_id: "req_1", run_id: RUN_ID, target_branch: "main", key_hash: FP };
  it("carries the key's hash and a branch name, never an option or an expression", () => {
    expect(parseServerFrame(JSON.stringify(ask))).toMatchObject({ ok: true });
    for (const [field, value] of [
      ["key_hash", "my-key"],
      ["target_branch", "--force"],
      ["target_branch", "main~1"],
      ["target_branch", "HEAD"],
    ] as const) {
      const bad = parseServerFrame(JSON.stringify({ ...ask, [field]: value }));
      expect(bad, `${field}=${value}`).toMatchObject({ ok: false, error: { code: "invalid_frame", path: field } });
    }
  });
  it("is answered with exactly one of apply and refusal", () => {
    const result = { type: "run.apply.result", request_id: "req_1" };
    expect(parseRunnerFrame(JSON.stringify({ ...result, apply }))).toMatchObject({ ok: true });
    const refusal = { reason: "dirty_tree", paths: ["README.md"], paths_truncated: false };
    expect(parseRunnerFrame(JSON.stringify({ ...result, refusal }))).toMatchObject({ ok: true });
    expect(parseRunnerFrame(JSON.stringify({ ...result, apply, refusal }))).toMatchObject({ ok: false });
    expect(parseRunnerFrame(JSON.stringify(result))).toMatchObject({ ok: false });
    const unknown = parseRunnerFrame(JSON.stringify({ ...result, refusal: { reason: "because" } }));
    expect(unknown).toMatchObject({ ok: false, error: { code: "invalid_frame" } });
  });
});
