import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { afterAll, describe, expect, it, onTestFinished } from "vitest";
import { DAEMON_WAIT_MS, FAKE_AGENT_BIN, poll, REPO_ROOT as ROOT, SERVER_BIN } from "../test-support/index.js";
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
    // The stdio config it prints works as printed: a real MCP client launches it and lists the tools.
    const stdioBlock = /^MCP client config, stdio.*\n(\{\n[\s\S]*?\n\})$/m.exec(demo.output())?.[1];
    expect(stdioBlock, demo.output()).toBeDefined();
    const stdio = JSON.parse(stdioBlock ?? "{}").mcpServers.webcodex as {
      command: string;
      args: string[];
      env: Record<string, string>;
    };
    expect(stdio.env.WEBCODEX_TOKEN).toBe(demo.token);
    const client = new Client({ name: "demo-stdio", version: "0" });
    await client.connect(
      new StdioClientTransport({
        command: stdio.command,
        args: stdio.args,
        env: { PATH: process.env.PATH ?? "", ...stdio.env },
        stderr: "pipe",
      }),
    );
    try {
      expect((await client.listTools()).tools.map((t) => t.name)).toContain("start_coding_agent");
    } finally {
      await client.close();
    }

    const run = await runCli(["run", "--project", "demo", "--provider", "fake", "scenario: tools"], demo);
    expect(run.stderr).toBe("");
    expect(run.code).toBe(0);
    expect(run.stdout).toContain("✔ completed");
    const runId = /wc_agent_run_[a-z0-9]+/.exec(run.stdout)?.[0];
    expect(runId).toMatch(/^wc_agent_run_[a-z0-9]+$/);

    // Every file the demo writes is private, so the Runner has nothing to warn about.
    for (const file of ["runner.toml", "server.toml", "runner.token", "principal.json"]) {
      expect((statSync(join(demo.dir, file)).mode & 0o777).toString(8), file).toBe("600");
    }
    expect(demo.output()).not.toContain("other users can read it");

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
    const started = demo;
    await poll(() => started.output().includes("oauth clients list"), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: 50,
      what: "the demo's OAuth instructions",
    });
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

    // The operator console: its URL and a key of the operator-only principal are printed, and that key signs in.
    expect(demo.output()).toContain(`open       ${origin}/console`);
    const operatorKey = /sign in with the operator key\s+(\S+)/.exec(demo.output())?.[1];
    expect(operatorKey).toMatch(/^wct_/);
    expect(operatorKey).not.toBe(demo.token);
    expect((statSync(join(demo.dir, "operator.json")).mode & 0o777).toString(8)).toBe("600");
    const loginForm = await fetch(`${origin}/console/login`);
    const loginCsrf = /name="login_csrf" value="([^"]*)"/.exec(await loginForm.text())?.[1] ?? "";
    const signedIn = await fetch(`${origin}/console/login`, {
      method: "POST",
      redirect: "manual",
      headers: {
        "content-type": "application/x-www-form-urlencoded",
        cookie: (loginForm.headers.get("set-cookie") ?? "").split(";")[0] ?? "",
      },
      body: new URLSearchParams({ login_csrf: loginCsrf, key: operatorKey ?? "" }),
    });
    expect(signedIn.status).toBe(303);
    expect(signedIn.headers.get("location")).toBe("/console");

    // The README's workflow-session example, as written, with the demo's token.
    const created = await runCli(["session", "create", "--project", "demo", "--title", "math fixes"], demo);
    expect(created.stderr).toBe("");
    const sessionId = /session (wc_sess_[a-z0-9]+) created on project demo/.exec(created.stdout)?.[1];
    expect(sessionId, created.stdout).toBeDefined();
    const sid = sessionId!;
    const recorded = await runCli(
      ["run", "--project", "demo", "--provider", "fake", "--session", sid, "Fix src/math.js."],
      demo,
    );
    expect(recorded.code, recorded.stderr).toBe(0);
    const updated = await runCli(
      ["session", "update", sid, "--handoff", "math.js fixed; math.test.js still flaky", "--goal", "all tests green"],
      demo,
    );
    expect(updated.code, updated.stderr).toBe(0);
    const continued = await runCli(
      ["run", "--project", "demo", "--provider", "fake", "--context-session", sid, "Continue from the handoff."],
      demo,
    );
    expect(continued.code, continued.stderr).toBe(0);
    const shown = await runCli(["session", "show", sid], demo);
    expect(shown.code, shown.stderr).toBe(0);
    expect(shown.stdout).toContain("all tests green");
    expect(shown.stdout).toContain("coding_agent_terminal");

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

  it("merges overrides/server.toml and overrides/runner.toml over the configs it regenerates, at every start", async () => {
    const stateDir = mkdtempSync(join(tmpdir(), "webcodex-demo-"));
    onTestFinished(() => removeDir(stateDir));
    mkdirSync(join(stateDir, "overrides"));
    // Observable effects of each file: a CORS origin on /mcp (Server) and a second agent (Runner).
    const corsOrigin = `https://inspector-${randomBytes(12).toString("hex")}.example`;
    const agentId = `override-agent-${randomBytes(6).toString("hex")}`;
    const overrides = {
      "server.toml": `[server]\ncors_origins = [${JSON.stringify(corsOrigin)}]\n`,
      "runner.toml":
        `[[acp.agents]]\nid = ${JSON.stringify(agentId)}\nname = "Second fake agent"\n` +
        `executable = ${JSON.stringify(process.execPath)}\nargs = [${JSON.stringify(FAKE_AGENT_BIN)}]\n`,
    };
    for (const [name, text] of Object.entries(overrides)) writeFileSync(join(stateDir, "overrides", name), text);

    for (const start of ["first start", "restart"]) {
      const started = await startDemo({ dir: stateDir });
      onTestFinished(async () => {
        await started.stop();
      });
      for (const name of ["server.toml", "runner.toml"]) {
        const firstLine = readFileSync(join(stateDir, name), "utf8").split("\n")[0];
        expect(firstLine, `${start}: ${name}`).toContain("Regenerated by scripts/demo.mjs at every `npm start`");
        // The demo reads its overrides and never writes them.
        expect(readFileSync(join(stateDir, "overrides", name), "utf8"), start).toBe(overrides[name as "server.toml"]);
      }
      const preflight = await fetch(started.url, {
        method: "OPTIONS",
        headers: { origin: corsOrigin, "access-control-request-method": "POST" },
      });
      expect(preflight.headers.get("access-control-allow-origin"), start).toBe(corsOrigin);
      // The Runner has both its generated agent and the override's; the demo's own token still works.
      const status = await runCli(["status"], started);
      expect(status.code, status.stderr).toBe(0);
      expect(status.stdout, start).toContain(agentId);
      expect(status.stdout, start).toContain("fake");
      expect(await started.stop()).toBe(0);
    }
  }, 180_000);

  it("refuses an override that is not valid TOML, naming the file and line, before writing any config", () => {
    const stateDir = mkdtempSync(join(tmpdir(), "webcodex-demo-"));
    onTestFinished(() => removeDir(stateDir));
    mkdirSync(join(stateDir, "overrides"));
    writeFileSync(join(stateDir, "overrides", "runner.toml"), "[acp]\nmax_concurrent_runs = = 2\n");
    const run = spawnSync(process.execPath, [join(ROOT, "scripts", "demo.mjs")], {
      cwd: ROOT,
      env: { ...process.env, WEBCODEX_DEMO_DIR: stateDir, WEBCODEX_DEMO_PORT: "0", NO_COLOR: "1" },
      encoding: "utf8",
      timeout: 60_000,
    });
    expect(run.status).toBe(1);
    expect(run.stderr).toContain(`${join(stateDir, "overrides", "runner.toml")} is not valid TOML`);
    expect(run.stderr).toContain("(line 2, column 23)");
    expect(existsSync(join(stateDir, "server.toml"))).toBe(false);
  });

  it("refuses a WEBCODEX_DEMO_WORKSPACE it does not know, naming what it takes, before writing any config", () => {
    const stateDir = mkdtempSync(join(tmpdir(), "webcodex-demo-"));
    onTestFinished(() => removeDir(stateDir));
    const run = spawnSync(process.execPath, [join(ROOT, "scripts", "demo.mjs")], {
      cwd: ROOT,
      env: {
        ...process.env,
        WEBCODEX_DEMO_DIR: stateDir,
        WEBCODEX_DEMO_PORT: "0",
        WEBCODEX_DEMO_WORKSPACE: "worktrees",
        NO_COLOR: "1",
      },
      encoding: "utf8",
      timeout: 60_000,
    });
    expect(run.status).toBe(1);
    expect(run.stderr).toContain("WEBCODEX_DEMO_WORKSPACE must be one of shared, worktree, got worktrees");
    expect(existsSync(join(stateDir, "server.toml"))).toBe(false);
  });

  it("stops in order when Ctrl-C ended the reader of its output first (npm start 2>&1 | tee log)", async () => {
    const piped = await startDemo({ throughPipe: true });
    onTestFinished(async () => {
      await piped.stop();
      removeDir(piped.dir);
    });
    expect(piped.output()).toContain("WebCodex demo is running");
    const tracked = piped.descendants();
    expect(tracked.size).toBeGreaterThanOrEqual(2);
    // Exit 0 is the orderly path (Runner, then Server, then exit); a write into the dead pipe that the
    // demo did not expect ends it with an uncaught EPIPE instead, and its daemons are SIGKILLed.
    expect(await piped.stop()).toBe(0);
    expect(survivors(tracked)).toEqual([]);
  }, 120_000);
});
