import { afterAll, describe, expect, it } from "vitest";
import { type DemoStack, removeDir, runCli, startDemo, survivors } from "./demo-stack.js";

describe("npm start (scripts/demo.mjs)", () => {
  let demo: DemoStack | undefined;
  let dir: string | undefined;

  afterAll(async () => {
    await demo?.stop();
    if (dir !== undefined) removeDir(dir);
  });

  it("starts a working stack, runs the fake agent through webcodex, and stops with no process left", async () => {
    demo = await startDemo();
    dir = demo.dir;
    expect(demo.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/mcp$/);
    expect(demo.output()).toContain('"Authorization": "Bearer ');

    const run = await runCli(["run", "--project", "demo", "--provider", "fake", "scenario: tools"], demo);
    expect(run.stderr).toBe("");
    expect(run.code).toBe(0);
    expect(run.stdout).toContain("✔ completed");
    const runId = /wc_agent_run_[a-z0-9]+/.exec(run.stdout)?.[0];
    expect(runId).toBeDefined();

    const status = await runCli(["status"], demo);
    expect(status.code).toBe(0);
    expect(status.stdout).toContain("demo  runner online");
    expect(status.stdout).toContain("fake");

    const tracked = demo.descendants();
    expect(tracked.size).toBeGreaterThanOrEqual(2);
    expect(await demo.stop()).toBe(0);
    expect(survivors(tracked)).toEqual([]);

    // Re-running reuses the state: the earlier run is still observable with the same token.
    demo = await startDemo({ dir: demo.dir });
    const observed = await runCli(["observe", runId!], demo);
    expect(observed.code).toBe(0);
    expect(observed.stdout).toContain("completed");
    const again = demo.descendants();
    expect(await demo.stop()).toBe(0);
    expect(survivors(again)).toEqual([]);
    demo = undefined;
  }, 180_000);
});
