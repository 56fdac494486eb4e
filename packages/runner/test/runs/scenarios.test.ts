/**
 * Every fake-agent scenario, run once against the real fake agent child:
 * the state, execution_state, stop_reason / failure_kind and event kinds the
 * contract defines (design §3, §4.3, §4.5), plus the ledger's count of
 * dispatched prompts and proof that no process of the run survived.
 */
import { createHash } from "node:crypto";
import { chmodSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { OUTSIDE_PROJECT_PATH } from "@webcodex/protocol";
import { afterAll, describe, expect, test, vi } from "vitest";
import { alive, readLedger } from "../../../../scripts/test-support/index.js";
import { groupMembers, kinds, makeWorkspace, newManager, runToEnd, writeConfig } from "../support/harness.js";

const ws = makeWorkspace();
const badInterpreter = join(ws.dir, "bad-interpreter.sh");
writeFileSync(badInterpreter, "#!/nonexistent/interpreter\n");
chmodSync(badInterpreter, 0o755);
const ledgerArgs = ["--ledger", ws.ledger];
const config = writeConfig(ws, {
  acp: { max_concurrent_runs: 8 },
  agents: [
    { id: "fake" },
    { id: "exit-init", args: [...ledgerArgs, "--exit-during-initialize"] },
    { id: "proto2", args: [...ledgerArgs, "--protocol-version", "2"] },
    { id: "fail-new", args: [...ledgerArgs, "--fail-session-new"] },
    { id: "missing-env", env: { PATH: "PATH", API_KEY: "WEBCODEX_TEST_SURELY_UNSET_VAR" } },
    { id: "bad-exec", executable: badInterpreter },
  ],
});
const { manager } = newManager(config, { maxMessageBytes: 1024 * 1024 });
// Agents that never answer a setup request get a short setup deadline of their own.
const hangConfig = writeConfig(ws, {
  acp: { setup_timeout_secs: 2 },
  agents: [
    { id: "hang-init", args: [...ledgerArgs, "--hang-on", "initialize"] },
    { id: "hang-new", args: [...ledgerArgs, "--hang-on", "session_new"] },
  ],
});
const { manager: hangManager } = newManager(hangConfig);

afterAll(async () => {
  await manager.close();
  await hangManager.close();
  ws.cleanup();
});

interface Case {
  name: string;
  prompt: string;
  provider?: string;
  state: string;
  execution: string;
  stop: string | null;
  failure: string | null;
  kinds: string[];
  /** Prompts the ledger must show for this case (0 = never dispatched). */
  dispatched: 0 | 1;
  message?: RegExp;
}

const T = "terminal";
const cases: Case[] = [
  {
    name: "hello",
    prompt: "scenario: hello",
    state: "completed",
    execution: "completed",
    stop: "end_turn",
    failure: null,
    kinds: ["agent_message", T],
    dispatched: 1,
  },
  {
    name: "tools",
    prompt: "scenario: tools",
    state: "completed",
    execution: "completed",
    stop: "end_turn",
    failure: null,
    kinds: ["agent_message", "file_change", "plan", "reasoning", T, "terminal_activity", "tool_activity", "usage"],
    dispatched: 1,
  },
  {
    name: "stop max_tokens",
    prompt: "scenario: stop reason=max_tokens",
    state: "failed",
    execution: "completed",
    stop: "max_tokens",
    failure: "stop_reason",
    kinds: [T],
    dispatched: 1,
  },
  {
    name: "stop max_turn_requests",
    prompt: "scenario: stop reason=max_turn_requests",
    state: "failed",
    execution: "completed",
    stop: "max_turn_requests",
    failure: "stop_reason",
    kinds: [T],
    dispatched: 1,
  },
  {
    name: "stop refusal",
    prompt: "scenario: stop reason=refusal",
    state: "failed",
    execution: "completed",
    stop: "refusal",
    failure: "stop_reason",
    kinds: [T],
    dispatched: 1,
  },
  {
    name: "stop cancelled",
    prompt: "scenario: stop reason=cancelled",
    state: "cancelled",
    execution: "completed",
    stop: "cancelled",
    failure: null,
    kinds: [T],
    dispatched: 1,
  },
  {
    name: "stop unknown",
    prompt: "scenario: stop reason=bogus",
    state: "failed",
    execution: "completed",
    stop: null,
    failure: "protocol_violation",
    kinds: [T],
    dispatched: 1,
  },
  {
    name: "prompt_error",
    prompt: "scenario: prompt_error",
    state: "failed",
    execution: "completed",
    stop: null,
    failure: "prompt_error",
    kinds: [T],
    dispatched: 1,
  },
  {
    name: "crash_before_response",
    prompt: "scenario: crash_before_response",
    state: "lost",
    execution: "outcome_unknown",
    stop: null,
    failure: "provider_exited",
    kinds: [T],
    dispatched: 1,
  },
  {
    name: "crash_after_response",
    prompt: "scenario: crash_after_response",
    state: "completed",
    execution: "completed",
    stop: "end_turn",
    failure: null,
    kinds: ["agent_message", T],
    dispatched: 1,
  },
  {
    name: "malformed",
    prompt: "scenario: malformed",
    state: "lost",
    execution: "outcome_unknown",
    stop: null,
    failure: "malformed_message",
    kinds: [T],
    dispatched: 1,
  },
  {
    name: "oversized",
    prompt: "scenario: oversized bytes=2000000",
    state: "lost",
    execution: "outcome_unknown",
    stop: null,
    failure: "oversized_message",
    kinds: [T],
    dispatched: 1,
  },
  {
    name: "fs_request",
    prompt: "scenario: fs_request",
    state: "completed",
    execution: "completed",
    stop: "end_turn",
    failure: null,
    kinds: ["agent_message", T],
    dispatched: 1,
  },
  {
    name: "terminal_request",
    prompt: "scenario: terminal_request",
    state: "completed",
    execution: "completed",
    stop: "end_turn",
    failure: null,
    kinds: ["agent_message", T],
    dispatched: 1,
  },
  {
    name: "ignored_updates",
    prompt: "scenario: ignored_updates",
    state: "completed",
    execution: "completed",
    stop: "end_turn",
    failure: null,
    kinds: ["agent_message", T],
    dispatched: 1,
  },
  {
    name: "exit during initialize",
    prompt: "scenario: hello",
    provider: "exit-init",
    state: "failed",
    execution: "not_started",
    stop: null,
    failure: "provider_exited",
    kinds: [T],
    dispatched: 0,
    message: /Stage: initialize\./,
  },
  {
    name: "unsupported protocol version",
    prompt: "scenario: hello",
    provider: "proto2",
    state: "failed",
    execution: "not_started",
    stop: null,
    failure: "unsupported_protocol_version",
    kinds: [T],
    dispatched: 0,
    message: /Stage: initialize\./,
  },
  {
    name: "session/new rejected",
    prompt: "scenario: hello",
    provider: "fail-new",
    state: "failed",
    execution: "not_started",
    stop: null,
    failure: "provider_rejected",
    kinds: [T],
    dispatched: 0,
    message: /Stage: session_new\./,
  },
  {
    name: "initialize never answered",
    prompt: "scenario: hello",
    provider: "hang-init",
    state: "failed",
    execution: "not_started",
    stop: null,
    failure: "setup_timeout",
    kinds: [T],
    dispatched: 0,
    message: /Stage: initialize\./,
  },
  {
    name: "session/new never answered",
    prompt: "scenario: hello",
    provider: "hang-new",
    state: "failed",
    execution: "not_started",
    stop: null,
    failure: "setup_timeout",
    kinds: [T],
    dispatched: 0,
    message: /Stage: session_new\./,
  },
  {
    name: "missing env source",
    prompt: "scenario: hello",
    provider: "missing-env",
    state: "failed",
    execution: "not_started",
    stop: null,
    failure: "missing_env",
    kinds: [T],
    dispatched: 0,
    message: /WEBCODEX_TEST_SURELY_UNSET_VAR/,
  },
  {
    name: "spawn failure",
    prompt: "scenario: hello",
    provider: "bad-exec",
    state: "failed",
    execution: "not_started",
    stop: null,
    failure: "provider_spawn_failed",
    kinds: [T],
    dispatched: 0,
    message: /Stage: spawn\./,
  },
];

const sha = (text: string) => createHash("sha256").update(text, "utf8").digest("hex");

describe("scenario table", () => {
  test.each(cases)("$name → $state / $execution", async (c) => {
    const prompt = `${c.prompt}\ncase: ${c.name}`;
    const m = c.provider?.startsWith("hang-") ? hangManager : manager;
    const { run, events } = await runToEnd(m, prompt, { provider_id: c.provider ?? "fake" });
    expect({
      state: run.state,
      execution: run.execution_state,
      stop: run.stop_reason,
      failure: run.failure_kind,
    }).toEqual({
      state: c.state,
      execution: c.execution,
      stop: c.stop,
      failure: c.failure,
    });
    expect(kinds(events)).toEqual([...c.kinds].sort());
    const last = events.at(-1);
    expect(last?.kind).toBe("terminal");
    expect(run.phase).toBe("terminal");
    expect(run.last_seq).toBe(last?.seq);
    if (c.message) expect(run.message).toMatch(c.message);
    if (c.execution === "not_started") expect(run.message).toMatch(/No prompt was dispatched\./);
    if (c.state === "lost") expect(run.recovery_kind).toBe("reconcile");
    const ledger = readLedger(ws.ledger);
    const prompts = ledger.filter((e) => e.event === "prompt" && e.prompt_sha256 === sha(prompt));
    expect(prompts).toHaveLength(c.dispatched);
    // The agent is its process group's leader (spawned directly, own group): no member of the group survived.
    for (const p of prompts) {
      expect(alive(p.pid as number)).toBe(false);
      expect(groupMembers(p.pid as number)).toEqual([]);
    }
  });

  test("tools: paths are project-relative, outside paths masked, tool activity carries no raw input", async () => {
    const { events } = await runToEnd(manager, "scenario: tools\ncase: paths");
    const paths = events.flatMap((e) => (e.kind === "file_change" ? [e.path] : []));
    expect(paths).toEqual(["src/math.js", OUTSIDE_PROJECT_PATH]);
    const tool = events.find((e) => e.kind === "tool_activity");
    expect(Object.keys(tool ?? {}).sort()).toEqual([
      "at",
      "kind",
      "seq",
      "status",
      "title",
      "tool_call_id",
      "tool_kind",
    ]);
    const usage = events.find((e) => e.kind === "usage");
    expect(usage).toMatchObject({ used_tokens: 1234, context_size: 200000, cost_amount: 0.0042, cost_currency: "USD" });
    const messages = events.flatMap((e) => (e.kind === "agent_message" ? [e.text] : []));
    // The final message arrives as two chunks; they coalesce into one event when they reach the Runner
    // together, and stay two when a busy machine delivers them in separate reads (text-pacer tests pin that).
    expect(messages.join("")).toBe("I fixed add() in src/math.js and the tests pass.");
    expect(messages.length).toBeLessThanOrEqual(2);
  });

  test("unsupported agent→client requests get method-not-found and the run continues", () => {
    const errors = readLedger(ws.ledger).filter((e) => e.event === "client_error");
    expect(errors.map((e) => [e.method, e.code])).toEqual(
      expect.arrayContaining([
        ["fs/read_text_file", -32601],
        ["terminal/create", -32601],
      ]),
    );
  });

  test("responses to requests the Runner never made are dropped before the SDK, which would log their text", async () => {
    const logged: string[] = [];
    const consoleError = vi.spyOn(console, "error").mockImplementation((...args: unknown[]) => {
      logged.push(args.map(String).join(" "));
    });
    const stderrWrite = process.stderr.write.bind(process.stderr);
    const stderr = vi.spyOn(process.stderr, "write").mockImplementation(((chunk: unknown, ...rest: never[]) => {
      logged.push(String(chunk));
      return stderrWrite(chunk as string, ...rest);
    }) as typeof process.stderr.write);
    try {
      const { run, events } = await runToEnd(manager, "scenario: stray_response\ncase: stray");
      expect(run).toMatchObject({ state: "completed", execution_state: "completed", stop_reason: "end_turn" });
      expect(events.some((e) => e.kind === "agent_message")).toBe(true);
    } finally {
      consoleError.mockRestore();
      stderr.mockRestore();
    }
    const text = logged.join("\n");
    expect(text).not.toContain("unknown request");
    expect(text).not.toContain("9.876543219876543e+26");
    expect(text).not.toContain("stray-response-canary");
  });

  test("ignored update variants are counted, not forwarded", async () => {
    const { run } = await runToEnd(manager, "scenario: ignored_updates\ncase: count");
    expect(run.ignored_updates).toBe(2);
  });
});
