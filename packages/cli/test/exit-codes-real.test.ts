/**
 * Exit codes 1 (failed) and 3 (lost) from the real `webcodex` executable
 * against the real `webcodex-server` process, a real Runner daemon and the
 * fake agent — the scripted-client tests in run-command.test.ts cover the
 * rendering; these prove the codes end to end.
 */
import { afterEach, describe, expect, it } from "vitest";
import { runCli } from "../../../scripts/test/demo-stack.js";
import { ProcStack } from "../../server/test/support/proc-stack.js";

describe("webcodex exit codes against a real stack", { timeout: 120_000 }, () => {
  let s: ProcStack | undefined;
  afterEach(async () => {
    await s?.stop();
    s = undefined;
  });

  async function stack(permissionTimeoutSecs?: number): Promise<{ url: string; token: string }> {
    s = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      ...(permissionTimeoutSecs !== undefined ? { permissionTimeoutSecs } : {}),
    }).init();
    await s.startRunner("r1");
    return { url: `http://127.0.0.1:${s.port}/mcp`, token: s.principalTokens.get("alice") ?? "" };
  }

  it("a run the agent fails exits 1", async () => {
    const env = await stack();
    const result = await runCli(["run", "--project", "demo", "--provider", "fake", "scenario: prompt_error"], env);
    expect(result.code, `${result.stdout}\n${result.stderr}`).toBe(1);
    expect(result.stdout).toContain("failed");
  });

  it("a run whose permission request reaches the Runner's deadline exits 4 (not 130: nobody pressed Ctrl-C)", async () => {
    const env = await stack(1);
    const result = await runCli(["run", "--project", "demo", "--provider", "fake", "scenario: permission"], env);
    expect(result.code, `${result.stdout}\n${result.stderr}`).toBe(4);
    expect(result.stdout).toContain("permission_timeout");
    const runId = /wc_agent_run_[a-z2-7]{26}/.exec(result.stdout)?.[0];
    const observed = await runCli(["observe", runId ?? "", "--json"], env);
    expect(observed.code).toBe(4);
    expect(observed.stdout).toContain('"exit_code":4');
  });

  it("a run whose Runner is killed mid-turn and restarted ends lost: the follower exits 3", async () => {
    const env = await stack();
    let killed: Promise<void> | undefined;
    const result = await runCli(
      ["run", "--project", "demo", "--provider", "fake", "scenario: slow interval_ms=100 count=600"],
      env,
      {
        onStdout: (text) => {
          // Once the turn is streaming (dispatched): kill -9 the Runner, then start it again.
          if (killed === undefined && text.includes("tick 3")) {
            killed = (async () => {
              await s?.killRunner("r1", "SIGKILL");
              await s?.waitOffline("r1");
              await s?.startRunner("r1");
            })();
          }
        },
      },
    );
    await killed;
    expect(result.code, `${result.stdout}\n${result.stderr}`).toBe(3);
    expect(result.stdout).toContain("lost");
    // `observe` of the settled run reports the same code.
    const runId = /wc_agent_run_[a-z2-7]{26}/.exec(result.stdout)?.[0];
    expect(runId).toMatch(/^wc_agent_run_/);
    const observed = await runCli(["observe", runId ?? ""], env);
    expect(observed.code).toBe(3);
    expect(s?.prompts("r1")).toHaveLength(1);
  });

  it("a call refused for want of a scope exits 1 and its advice names that scope, not another", async () => {
    // The stack's principals hold coding_agent:run and project:* but no runtime:* scope.
    const env = await stack();
    const result = await runCli(["session", "create", "--project", "demo", "--title", "math fixes"], env);
    expect(result.code, result.stderr).toBe(1);
    expect(result.stderr).toContain("this token lacks runtime:write");
    expect(result.stderr).toContain("Ask the operator for a token issued with --scope runtime:write");
    expect(result.stderr).not.toContain("coding_agent:run");
  });

  it("starts `run` as an MCP task: after the CLI exits, `observe TASK_ID` follows the same run and `cancel TASK_ID` reaches it", async () => {
    const env = await stack();
    let stopped = false;
    const first = await runCli(
      ["run", "--json", "--project", "demo", "--provider", "fake", "scenario: slow interval_ms=100 count=600"],
      env,
      {
        // Leave like a killed CLI once the run is under way (the run goes on).
        onStdout: (text, child) => {
          if (!stopped && text.includes('"type":"started"')) {
            stopped = true;
            child.kill("SIGKILL");
          }
        },
      },
    );
    const started = JSON.parse(first.stdout.split("\n").find((l) => l.includes('"type":"started"')) ?? "{}") as {
      run_id: string;
      task_id: string;
    };
    expect(started.task_id, first.stdout).toMatch(/^wc_task_[a-z2-7]{26}_[A-Za-z0-9_-]{22}$/);
    expect(started.task_id.slice("wc_task_".length, -23)).toBe(started.run_id.slice("wc_agent_run_".length));

    const cancelled = await runCli(["cancel", "--json", started.task_id], env);
    expect(cancelled.code, cancelled.stderr).toBe(0);
    expect(cancelled.stdout).toContain(started.run_id);
    const followed = await runCli(["observe", "--json", started.task_id, "--follow"], env);
    expect(followed.code, followed.stderr).toBe(130);
    expect(followed.stdout).toContain(`"run_id":"${started.run_id}"`);
    expect(followed.stdout).toContain('"state":"cancelled"');
  });
});
