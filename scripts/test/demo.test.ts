import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { type DemoStack, removeDir, runCli, startDemo, survivors } from "./demo-stack.js";

const SERVER_BIN = join(import.meta.dirname, "..", "..", "packages", "server", "bin", "webcodex-server.js");

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
    expect(runId).toMatch(/^wc_agent_run_[a-z0-9]+$/);

    const status = await runCli(["status"], demo);
    expect(status.code).toBe(0);
    expect(status.stdout).toContain("demo  runner online");
    expect(status.stdout).toContain("fake");

    // OAuth is on with the demo's loopback URL as public_url; the printed key is the one to type.
    const origin = new URL(demo.url).origin;
    const prm = (await (await fetch(`${origin}/.well-known/oauth-protected-resource/mcp`)).json()) as {
      resource: string;
      authorization_servers: string[];
    };
    expect(prm).toMatchObject({ resource: demo.url, authorization_servers: [origin] });
    for (let i = 0; i < 100 && !demo.output().includes("oauth clients list"); i++) {
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(demo.output()).toContain(`access key to type on the consent page   ${demo.token}`);
    const allow = /npx webcodex-server oauth clients allow-coding-agent-run CLIENT_ID --config (\S+)/.exec(
      demo.output(),
    );
    expect(allow).not.toBeNull();
    const clients = spawnSync(
      process.execPath,
      [SERVER_BIN, "oauth", "clients", "list", "--json", "--config", allow![1]!],
      {
        encoding: "utf8",
      },
    );
    expect(clients.status).toBe(0);
    expect(JSON.parse(clients.stdout)).toEqual([]);

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
