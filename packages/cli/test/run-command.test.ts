import { describe, expect, it } from "vitest";
import { runCli } from "../src/cli.js";
import { CliError } from "../src/errors.js";
import { Observation } from "../src/wire.js";
import { loadRecorded, type Recorded, scriptedClient, testContext } from "./support.js";

const recorded = loadRecorded("tools-run");
const RUN = recorded.start.run_id;

function withFinal(final: Partial<Observation>): Recorded {
  const last = recorded.observations.at(-1)!;
  return { ...recorded, observations: [...recorded.observations.slice(0, -1), { ...last, ...final }] };
}

describe("webcodex run", () => {
  it("starts with a generated key, follows with tokens until terminal, and exits 0", async () => {
    const client = scriptedClient(recorded);
    const { ctx, stdout } = testContext(client);
    expect(await runCli(["run", "--project", "demo", "--provider", "fake", "scenario: tools"], ctx)).toBe(0);
    const [start, ...observes] = client.calls;
    expect(start).toMatchObject({
      tool: "start_coding_agent",
      args: { project_id: "demo", provider_id: "fake", prompt: "scenario: tools" },
    });
    const key = (start?.args as { idempotency_key: string } | undefined)?.idempotency_key;
    expect(key).toMatch(/^cli-/);
    expect(stdout.text).toContain(`rerun it with --key ${key}`);
    expect(observes.map((c) => (c.args as { after_observation_token?: string }).after_observation_token)).toEqual([
      "t0",
      "t1",
      "t2",
    ]);
    // has_more on the second observation → the third asks without waiting.
    expect(observes.map((c) => (c.args as { wait_secs: number }).wait_secs)).toEqual([25, 25, 0]);
    expect(stdout.text).toContain("✔ completed · stop reason end_turn");
  });

  it.each<[Partial<Observation>, number]>([
    [{ state: "failed", execution_state: "not_started", failure_kind: "provider_exited", stop_reason: undefined }, 1],
    [{ state: "lost", execution_state: "outcome_unknown", stop_reason: undefined }, 3],
    [{ state: "cancelled", stop_reason: "cancelled" }, 130],
  ])("exits with the terminal state's code: %j → %i", async (final, code) => {
    const { ctx } = testContext(scriptedClient(withFinal(final)));
    expect(await runCli(["run", "--project", "demo", "--provider", "fake", "--key", "k", "x"], ctx)).toBe(code);
  });

  it("passes --key, --timeout and --config through and reads a '-' prompt from stdin", async () => {
    const client = scriptedClient(recorded);
    const { ctx } = testContext(client);
    await runCli(
      [
        "run",
        "--project",
        "demo",
        "--provider",
        "fake",
        "--key",
        "mine",
        "--timeout",
        "90",
        "--config",
        "mode=fast",
        "-",
      ],
      ctx,
    );
    expect(client.calls[0]?.args).toEqual({
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "mine",
      prompt: "prompt from stdin",
      config: { mode: "fast" },
      timeout_secs: 90,
    });
  });

  it("on Ctrl-C asks the Server to cancel and keeps following to the terminal state", async () => {
    const cancelled = withFinal({ state: "cancelled", execution_state: "completed", stop_reason: "cancelled" });
    let interrupt = () => {};
    const client = scriptedClient(cancelled, { beforeObserve: (i) => i === 1 && interrupt() });
    const t = testContext(client);
    interrupt = t.interrupt;
    expect(
      await runCli(["run", "--project", "demo", "--provider", "fake", "--key", "k", "scenario: slow"], t.ctx),
    ).toBe(130);
    expect(client.calls.filter((c) => c.tool === "cancel_coding_agent")).toEqual([
      { tool: "cancel_coding_agent", args: { run_id: RUN } },
    ]);
    expect(client.calls.filter((c) => c.tool === "observe_coding_agent")).toHaveLength(3);
    expect(t.stdout.text).toContain("asking the Server to cancel");
    expect(t.stdout.text).toContain("⊘ cancelled");
  });

  it("on a second Ctrl-C stops following at once with 130 and says how to come back", async () => {
    let interrupt = () => {};
    const client = scriptedClient(
      { ...recorded, observations: [recorded.observations[0]!] },
      {
        beforeObserve: (i) => {
          if (i !== 1) return;
          interrupt();
          interrupt();
        },
      },
    );
    const t = testContext(client);
    interrupt = t.interrupt;
    expect(await runCli(["run", "--project", "demo", "--provider", "fake", "--key", "k", "x"], t.ctx)).toBe(130);
    expect(client.calls.filter((c) => c.tool === "cancel_coding_agent")).toHaveLength(1);
    expect(t.stdout.text).toContain(`webcodex observe ${RUN} --follow`);
  });

  it("--continue passes continue_run_id and says which run it continues; a malformed id is a usage error", async () => {
    const parent = "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa";
    const client = scriptedClient(recorded);
    const { ctx, stdout } = testContext(client);
    const argv = [
      "run",
      "--project",
      "demo",
      "--provider",
      "fake",
      "--key",
      "k2",
      "--continue",
      parent,
      "now the tests",
    ];
    expect(await runCli(argv, ctx)).toBe(0);
    expect(client.calls[0]?.args).toEqual({
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "k2",
      prompt: "now the tests",
      continue_run_id: parent,
    });
    expect(stdout.text).toContain(`continues ${parent}`);
    const untouched = scriptedClient(recorded);
    const bad = testContext(untouched);
    const code = await runCli(["run", "--project", "demo", "--provider", "fake", "--continue", "run-1", "x"], bad.ctx);
    expect(code).toBe(2);
    expect(bad.stderr.text).toContain("--continue expects the RUN_ID (wc_agent_run_…) or TASK_ID (wc_task_…)");
    expect(untouched.calls).toHaveLength(0);
  });

  it("prints ndjson with --json: started, states, events, summary", async () => {
    const { ctx, stdout } = testContext(scriptedClient(recorded));
    expect(await runCli(["run", "--json", "--project", "demo", "--provider", "fake", "--key", "k", "x"], ctx)).toBe(0);
    const types = stdout.text
      .trimEnd()
      .split("\n")
      .map((l) => (JSON.parse(l) as { type: string }).type);
    expect(types[0]).toBe("started");
    expect(types.at(-1)).toBe("summary");
    expect(types.filter((t) => t === "event")).toHaveLength(12);
  });

  it("reports a tool error with its code and hint and exits 1 (ndjson with --json)", async () => {
    const client = scriptedClient(recorded);
    client.start = async () => {
      throw new CliError("tool", "project demo has no provider nope", {
        toolCode: "provider_unavailable",
        recoveryKind: "fix_input",
      });
    };
    const text = testContext(client);
    expect(await runCli(["run", "--project", "demo", "--provider", "nope", "x"], text.ctx)).toBe(1);
    expect(text.stderr.text).toContain("error: project demo has no provider nope");
    const json = testContext(client);
    expect(await runCli(["run", "--json", "--project", "demo", "--provider", "nope", "x"], json.ctx)).toBe(1);
    expect(JSON.parse(json.stdout.text)).toMatchObject({
      type: "error",
      code: "provider_unavailable",
      recovery_kind: "fix_input",
    });
  });

  it("when the Server says retry_same (e.g. Runner offline), names the key to retry with", async () => {
    const client = scriptedClient(recorded);
    client.start = async () => {
      throw new CliError("tool", "The project's Runner is offline.", {
        toolCode: "runner_unavailable",
        recoveryKind: "retry_same",
      });
    };
    const t = testContext(client);
    expect(await runCli(["run", "--project", "demo", "--provider", "fake", "--key", "k9", "x"], t.ctx)).toBe(1);
    expect(t.stderr.text).toContain("Retry later with the same key: --key k9");
  });

  it("after a connection failure on start, tells the user the key that reattaches", async () => {
    const client = scriptedClient(recorded);
    client.start = async () => {
      throw new CliError("connection", "cannot reach the Server at http://x/mcp");
    };
    const t = testContext(client);
    expect(await runCli(["run", "--project", "demo", "--provider", "fake", "--key", "abc", "x"], t.ctx)).toBe(1);
    expect(t.stderr.text).toContain("--key abc reattaches");
  });
});

describe("webcodex observe, cancel, status", () => {
  it("observe shows a snapshot and exits with the state's code", async () => {
    const client = scriptedClient({ ...recorded, observations: [withFinal({}).observations.at(-1)!] });
    const { ctx, stdout } = testContext(client);
    expect(await runCli(["observe", RUN], ctx)).toBe(0);
    expect(client.calls[0]).toEqual({ tool: "observe_coding_agent", args: { run_id: RUN, wait_secs: 0 } });
    expect(stdout.text).toContain("Fixed add().");
    expect(stdout.text).toContain("✔ completed");
  });

  it("observe --follow follows from the baseline to the end", async () => {
    const client = scriptedClient(recorded);
    const { ctx, stdout } = testContext(client);
    expect(await runCli(["observe", "--follow", RUN], ctx)).toBe(0);
    expect(client.calls.map((c) => (c.args as { after_observation_token?: string }).after_observation_token)).toEqual([
      undefined,
      "t1",
      "t2",
    ]);
    expect(stdout.text).toContain("Looking at the test first.");
  });

  it("observe --follow counts the run's own time, not the time spent following it", async () => {
    const startedAt = Date.now() - 90_000;
    const at = (ms: number) => new Date(ms).toISOString();
    const base = { run_id: RUN, recovery_kind: "none", history_lost: false, has_more: false };
    const observations = [
      Observation.parse({
        ...base,
        state: "running",
        execution_state: "started",
        observation_token: "t1",
        events: [{ seq: 1, at: at(startedAt), kind: "agent_message", text: "working\n", truncated: false }],
      }),
      Observation.parse({
        ...base,
        state: "completed",
        execution_state: "completed",
        stop_reason: "end_turn",
        observation_token: "t2",
        events: [
          {
            seq: 2,
            at: at(startedAt + 75_000),
            kind: "terminal",
            state: "completed",
            execution_state: "completed",
            stop_reason: "end_turn",
            // Every terminal event carries its message (the protocol's TerminalEvent); the CLI reads events with it.
            message: "The agent completed the turn.",
          },
        ],
      }),
    ];
    const { ctx, stdout } = testContext(scriptedClient({ start: recorded.start, observations }), { NO_COLOR: "1" });
    stdout.isTTY = true;
    expect(await runCli(["observe", "--follow", RUN], ctx)).toBe(0);
    // The spinner, drawn while following, shows how long the run has been going (90 s), …
    expect(stdout.text).toContain("running · 1m 30s");
    expect(stdout.text).not.toContain("running · 0.0s");
    // … and the closing line the run's duration, first event to terminal event.
    expect(stdout.text).toMatch(/✔ completed · stop reason end_turn · 1m 15s · /);
  });

  it("cancel prints the result and exits 0, also when already terminal", async () => {
    const client = scriptedClient(recorded, {
      cancel: (id) => ({ run_id: id, state: "completed", cancel_requested: false, already_terminal: true }),
    });
    const { ctx, stdout } = testContext(client);
    expect(await runCli(["cancel", RUN], ctx)).toBe(0);
    expect(stdout.text).toContain("already completed; nothing to cancel");
  });

  it("status lists projects (ndjson with --json)", async () => {
    const projects = [{ project_id: "demo", runner_online: true, allow_patch: true, providers: [] }];
    const { ctx, stdout } = testContext(scriptedClient(recorded, { projects }));
    expect(await runCli(["status", "--json"], ctx)).toBe(0);
    expect(JSON.parse(stdout.text)).toEqual({ type: "project", ...projects[0] });
  });
});
