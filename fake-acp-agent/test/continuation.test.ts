import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, test } from "vitest";
import { cleanup, messageText, spawnAgent, startAgent, TextCapture, tempDir } from "./harness.js";

afterEach(cleanup);

const CWD = "/tmp/fake-project";

/** initialize + session/new + one prompt carrying `nonce`, then stop: the session now lives only on disk. */
async function firstTurn(args: string[], nonce: string): Promise<string> {
  const agent = startAgent(args);
  const sessionId = await agent.start(CWD);
  expect((await agent.prompt(sessionId, `scenario: hello\nnonce: ${nonce}`)).stopReason).toBe("end_turn");
  await agent.stop();
  return sessionId;
}

describe("continuation (session/load, session/resume)", () => {
  test("advertises nothing by default; --continuation both advertises loadSession and sessionCapabilities.resume", async () => {
    const plain = startAgent();
    const caps = (await plain.initialize()).agentCapabilities;
    expect(caps?.loadSession).toBe(false);
    expect(caps?.sessionCapabilities).toBeUndefined();
    await expect(plain.agent.request("session/resume", { sessionId: "x", cwd: CWD })).rejects.toMatchObject({
      code: -32601,
    });

    const dir = tempDir();
    for (const [mode, load, resume] of [
      ["load", true, false],
      ["resume", false, true],
      ["both", true, true],
    ] as const) {
      const agent = startAgent(["--continuation", mode, "--session-dir", dir]);
      const c = (await agent.initialize()).agentCapabilities;
      expect(c?.loadSession).toBe(load);
      expect(c?.sessionCapabilities?.resume !== undefined).toBe(resume);
      await agent.stop();
    }
  });

  test("--continuation without a session dir is a usage error (exit 2)", async () => {
    const child = spawnAgent(["--continuation", "resume"]);
    const stderr = new TextCapture(child.stderr!);
    const code = await new Promise<number | null>((r) => child.once("exit", (c) => r(c)));
    expect(code).toBe(2);
    expect(stderr.text).toContain("--continuation resume needs --session-dir");
  });

  test("session/resume in a new process: recall answers the previous prompt's nonce line; a fresh session recalls nothing", async () => {
    const dir = tempDir();
    const ledger = join(tempDir(), "ledger.jsonl");
    const args = ["--continuation", "resume", "--session-dir", dir, "--ledger", ledger];
    const sessionId = await firstTurn(args, "n-0001");
    expect(sessionId).toMatch(/^fake-session-[0-9a-f-]{36}$/);
    expect(readdirSync(dir)).toEqual([`${sessionId}.json`]);

    const agent = startAgent(args);
    await agent.initialize();
    await agent.agent.request("session/resume", { sessionId, cwd: CWD });
    await agent.prompt(sessionId, "scenario: recall\nnonce: n-0002");
    expect(agent.messageText()).toBe("recall: nonce: n-0001");
    // Resume replays nothing.
    expect(agent.updates.filter((u) => u.sessionUpdate === "user_message_chunk")).toEqual([]);

    const fresh = await agent.session(CWD);
    await fresh.prompt("scenario: recall");
    expect(fresh.messageText()).toBe("recall: nothing");
    await agent.stop();

    const events = readFileSync(ledger, "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { event: string; found?: boolean });
    expect(events.filter((e) => e.event === "session_resume")).toEqual([
      expect.objectContaining({ session_id: sessionId, found: true }),
    ]);
  });

  test("session/load replays the history as session/update before answering, and the chain goes on", async () => {
    const dir = tempDir();
    const args = ["--continuation", "load", "--session-dir", dir];
    const sessionId = await firstTurn(args, "n-a");

    const second = startAgent(args);
    await second.initialize();
    await second.agent.request("session/load", { sessionId, cwd: CWD, mcpServers: [] });
    // Replayed before the answer arrived: the prompt as a user chunk, then the marker.
    expect(second.updates).toEqual([
      { sessionUpdate: "user_message_chunk", content: { type: "text", text: "scenario: hello\nnonce: n-a" } },
      { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "replayed: turn 1" } },
    ]);
    await second.prompt(sessionId, "scenario: recall\nnonce: n-b");
    expect(messageText(second.updates.slice(2))).toBe("recall: nonce: n-a");
    await second.stop();

    const third = startAgent(args);
    await third.initialize();
    await third.agent.request("session/load", { sessionId, cwd: CWD, mcpServers: [] });
    expect(third.updates.filter((u) => u.sessionUpdate === "user_message_chunk")).toHaveLength(2);
    const before = third.updates.length;
    await third.prompt(sessionId, "scenario: recall");
    expect(messageText(third.updates.slice(before))).toBe("recall: nonce: n-b");
    await third.stop();
  });

  test("an unknown session id is session-not-found; a method not advertised is method-not-found", async () => {
    const dir = tempDir();
    const agent = startAgent(["--continuation", "load", "--session-dir", dir]);
    await agent.initialize();
    await expect(
      agent.agent.request("session/load", { sessionId: "fake-session-nope", cwd: CWD, mcpServers: [] }),
    ).rejects.toMatchObject({ code: -32002 });
    await expect(
      agent.agent.request("session/load", { sessionId: "../x", cwd: CWD, mcpServers: [] }),
    ).rejects.toMatchObject({
      code: -32002,
    });
    await expect(
      agent.agent.request("session/resume", { sessionId: "fake-session-nope", cwd: CWD }),
    ).rejects.toMatchObject({ code: -32601 });
    await agent.stop();
  });

  test("FAKE_ACP_SESSION_DIR names the dir when the flag is absent", async () => {
    const dir = tempDir();
    const agent = startAgent(["--continuation", "both"], { ...process.env, FAKE_ACP_SESSION_DIR: dir });
    const sessionId = await agent.start(CWD);
    await agent.stop();
    expect(readdirSync(dir)).toEqual([`${sessionId}.json`]);
  });
});
