import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, test } from "vitest";
import { canary } from "../../scripts/vitest/canary.js";
import { cleanup, settledWithin, spawnAgent, startAgent, TextCapture, tempDir } from "./harness.js";

afterEach(cleanup);

describe("initialize", () => {
  test("answers protocol version 1 with honest, minimal capabilities and no loadSession", async () => {
    const agent = startAgent();
    const response = await agent.initialize();
    expect(response).toEqual({
      protocolVersion: 1,
      agentCapabilities: {
        loadSession: false,
        promptCapabilities: { image: false, audio: false, embeddedContext: false },
        mcpCapabilities: { http: false, sse: false },
      },
      authMethods: [],
      agentInfo: { name: "fake-acp-agent", title: "Fake ACP agent", version: "0.1.0" },
    });
    const session = await agent.newSession();
    expect(session).toEqual({ sessionId: "fake-session-1" });
    expect(await agent.stop()).toEqual({ code: 0, signal: null });
  });

  test("--protocol-version 99 answers initialize with protocolVersion 99", async () => {
    const agent = startAgent(["--protocol-version", "99"]);
    expect((await agent.initialize()).protocolVersion).toBe(99);
    await agent.stop();
  });

  test("--exit-during-initialize exits 1 without answering", async () => {
    const agent = startAgent(["--exit-during-initialize"]);
    await expect(agent.initialize()).rejects.toThrow();
    expect(await agent.exited).toEqual({ code: 1, signal: null });
  });

  test("--hang-on initialize never answers and survives stdin EOF until killed", async () => {
    const agent = startAgent(["--hang-on", "initialize"]);
    const answer = agent.initialize();
    answer.catch(() => {});
    await agent.stderr.until("holding open (hang-on initialize)");
    expect(await settledWithin(answer, 200)).toBe("pending");
    expect(await agent.stop(300)).toEqual({ code: null, signal: "SIGKILL" });
  });

  test("--hang-on session_new answers initialize but never session/new", async () => {
    const agent = startAgent(["--hang-on", "session_new"]);
    await agent.initialize();
    const created = agent.newSession();
    created.catch(() => {});
    await agent.stderr.until("holding open (hang-on session_new)");
    expect(await settledWithin(created, 200)).toBe("pending");
    expect(await agent.stop(300)).toEqual({ code: null, signal: "SIGKILL" });
  });

  test("--fail-session-new answers session/new with a JSON-RPC error", async () => {
    const agent = startAgent(["--fail-session-new"]);
    await agent.initialize();
    await expect(agent.newSession()).rejects.toMatchObject({ code: -32603, message: "fake session/new failure" });
    await agent.stop();
  });

  test("--session-new-delay-ms delays the session/new answer", async () => {
    const agent = startAgent(["--session-new-delay-ms", "300"]);
    await agent.initialize();
    const started = performance.now();
    await agent.newSession();
    expect(performance.now() - started).toBeGreaterThanOrEqual(250);
    await agent.stop();
  });
});

describe("command line", () => {
  test("--env-names writes the sorted names (not values) of its environment", async () => {
    const file = join(tempDir(), "env.json");
    const secret = canary("env-value");
    const env = { ZED_VAR: "z-value", PATH: process.env.PATH ?? "/usr/bin", ALPHA_SECRET: secret };
    const agent = startAgent(["--env-names", file], env);
    await agent.initialize();
    const written = readFileSync(file, "utf8");
    expect(JSON.parse(written)).toEqual(["ALPHA_SECRET", "PATH", "ZED_VAR"]);
    expect(written).not.toContain(secret);
    await agent.stop();
  });

  test.each([
    [["--no-such-flag"], "Unknown option"],
    [["--hang-on", "prompt"], "--hang-on expects initialize or session_new"],
    [["--config-options", "mode,colour"], 'unknown option "colour"'],
    [["--session-new-delay-ms", "soon"], "--session-new-delay-ms expects a non-negative integer"],
  ])("rejects %j with exit 2 and a message on stderr", async (args, message) => {
    const child = spawnAgent(args);
    const stderr = new TextCapture(child.stderr!);
    const code = await new Promise((resolve) => child.once("exit", resolve));
    expect(code).toBe(2);
    expect(stderr.text).toContain(message);
  });
});
