/**
 * Issue 12 §3: the effective-config snapshot holds every config option the
 * agent advertised (id and current value, bounded), the Server keeps it on
 * the run record (across a restart) and observe returns it as
 * `effective_config`. Real Server (child process), real Runner, fake agent.
 */
import { afterEach, describe, expect, it } from "vitest";
import { ObserveToolOutput } from "../../src/runs/tool-schemas.js";
import { okValue, ProcStack } from "../support/proc-stack.js";

describe("effective_config", () => {
  let s: ProcStack | undefined;
  afterEach(async () => {
    await s?.stop();
    s = undefined;
  });

  it("observe returns every option the agent advertised with its value, kept on the record across a Server restart", async () => {
    s = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      agentArgs: ["--config-options", "mode,model,reasoning_effort"],
    }).init();
    await s.startRunner("r1");
    const started = okValue(
      await s.start("alice", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: "cfg",
        prompt: "scenario: hello",
        config: { model: "fake-large" },
      }),
    );
    const done = await s.untilTerminal(started.run_id);
    expect(done.state).toBe("completed");
    // The caller's key, and the options it did not set (mode moved by model's side effect).
    const expected = { model: "fake-large", mode: "code", reasoning_effort: "medium" };
    expect(Object.fromEntries(done.effective_config.map((e) => [e.id, e.value]))).toEqual(expected);
    expect(ObserveToolOutput.safeParse(done).success).toBe(true);

    await s.killServer("SIGKILL");
    await s.startServer();
    const after = okValue(await s.observe("alice", { run_id: started.run_id }));
    expect(Object.fromEntries(after.effective_config.map((e) => [e.id, e.value]))).toEqual(expected);
  });
});
