/**
 * The real thing: `webcodex` processes against a real Server, Runner and fake
 * agent (the demo stack on a free port, in a temp folder).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type DemoStack, removeDir, runCli, startDemo, survivors } from "../../../scripts/test/demo-stack.js";

const SLOW = "scenario: slow interval_ms=50 count=2000";

describe("webcodex against a real stack", () => {
  let stack: DemoStack;

  beforeAll(async () => {
    stack = await startDemo();
  }, 120_000);

  afterAll(async () => {
    if (stack === undefined) return;
    const tracked = stack.descendants();
    await stack.stop();
    removeDir(stack.dir);
    expect(survivors(tracked)).toEqual([]);
  });

  it("Ctrl-C during run asks the Server to cancel, follows to cancelled, and exits 130", async () => {
    let sent = false;
    const result = await runCli(["run", "--project", "demo", "--provider", "fake", SLOW], stack, {
      onStdout: (text, child) => {
        if (!sent && text.includes("tick 40")) {
          sent = true;
          child.kill("SIGINT");
        }
      },
    });
    const context = `${result.stdout}\n${result.stderr}`;
    expect(result.code, context).toBe(130);
    // Nothing on stderr: no warnings (e.g. listener leaks over many observes), no errors.
    expect(result.stderr).toBe("");
    expect(result.stdout).toContain("asking the Server to cancel");
    expect(result.stdout).toContain("⊘ cancelled · stop reason cancelled");
  });

  it("webcodex cancel from another process ends the follower with 130", async () => {
    let cancelled: Promise<unknown> | undefined;
    const result = await runCli(["run", "--json", "--project", "demo", "--provider", "fake", SLOW], stack, {
      onStdout: (text) => {
        const runId = /"run_id":"(wc_agent_run_[a-z0-9]+)"/.exec(text)?.[1];
        if (cancelled === undefined && runId !== undefined && text.includes("tick 1")) {
          cancelled = runCli(["cancel", runId], stack);
        }
      },
    });
    expect(result.code, result.stdout + result.stderr).toBe(130);
    expect(await cancelled).toMatchObject({ code: 0 });
    const lines = result.stdout
      .trimEnd()
      .split("\n")
      .map((l) => JSON.parse(l) as { type: string; kind?: string; state?: string });
    expect(lines[0]?.type).toBe("started");
    expect(lines.some((l) => l.type === "event" && l.kind === "agent_message")).toBe(true);
    expect(lines.at(-1)).toMatchObject({ type: "summary", state: "cancelled", exit_code: 130 });
  });

  it("a wrong token is a clear auth error with exit 1", async () => {
    const result = await runCli(["status"], { url: stack.url, token: "wct_not_a_real_token" });
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(/token|unauthorized/i);
  });
});
