import { spawn } from "node:child_process";
import { once } from "node:events";
import { closeSync } from "node:fs";
import { RequestError } from "@agentclientprotocol/sdk";
import { z } from "zod";
import { never } from "../lifecycle.js";
import { END_TURN, intParam, noParams, type Scenario, say, scenario } from "../turn.js";

export const promptError: Scenario = scenario("prompt_error", noParams, async () => {
  throw new RequestError(-32603, "fake prompt failure");
});

export const crashBeforeResponse: Scenario = scenario("crash_before_response", noParams, async () => {
  process.exit(1);
});

export const crashAfterResponse: Scenario = scenario("crash_after_response", noParams, async (turn) => {
  turn.out.onWritten((message) => {
    if ("id" in message && !("method" in message) && message.id === turn.requestId) process.exit(1);
  });
  await say(turn, "Answering end_turn, then exiting with status 1.");
  return END_TURN;
});

export const malformed: Scenario = scenario("malformed", noParams, async (turn) => {
  await turn.out.rawLine("this is not json {");
  return never();
});

export const oversized: Scenario = scenario(
  "oversized bytes=2000000",
  z.object({ bytes: intParam(2_000_000, 1, 256 * 1024 * 1024) }).strict(),
  async (turn, { bytes }) => {
    const line = JSON.stringify({
      jsonrpc: "2.0",
      method: "session/update",
      params: {
        sessionId: turn.session.id,
        update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "x".repeat(bytes + 1) } },
      },
    });
    await turn.out.rawLine(line);
    return never();
  },
);

/** A JSON-RPC id no client ever sent (beyond Number.MAX_SAFE_INTEGER), and text a client must not echo. */
export const STRAY_RESPONSE_ID = "987654321987654321987654321";
export const STRAY_RESPONSE_TEXT = "stray-response-canary";

export const strayResponse: Scenario = scenario("stray_response", noParams, async (turn) => {
  await turn.out.rawLine(`{"jsonrpc":"2.0","id":${STRAY_RESPONSE_ID},"result":{"note":"${STRAY_RESPONSE_TEXT}"}}`);
  await turn.out.rawLine(
    JSON.stringify({ jsonrpc: "2.0", id: STRAY_RESPONSE_TEXT, error: { code: -32000, message: STRAY_RESPONSE_TEXT } }),
  );
  await say(turn, "Sent two responses to requests nobody made.");
  return END_TURN;
});

export const hang: Scenario = scenario("hang", noParams, async (turn) => {
  turn.life.holdOpen("scenario hang");
  return never();
});

/** Closes its stdout (the ACP channel) and lives on: no answer, no exit, stdin EOF ignored. */
export const closeStdout: Scenario = scenario("close_stdout", noParams, async (turn) => {
  turn.life.holdOpen("scenario close_stdout");
  closeSync(1);
  return never();
});

/** A node process that ignores SIGTERM, says "ready" once it does, and never exits on its own. */
const GRANDCHILD_SOURCE =
  "process.on('SIGTERM', () => {}); setInterval(() => {}, 1 << 30); process.stdout.write('ready\\n');";

export const grandchild: Scenario = scenario("grandchild", noParams, async (turn) => {
  const child = spawn(process.execPath, ["-e", GRANDCHILD_SOURCE], {
    detached: false,
    stdio: ["ignore", "pipe", "ignore"],
  });
  // Wait until its SIGTERM handler is installed, then let go of it entirely.
  await once(child, "spawn");
  await Promise.race([
    once(child.stdout, "data"),
    once(child, "exit").then(([code]) => Promise.reject(new Error(`grandchild exited early (${code})`))),
  ]);
  child.stdout.destroy();
  child.unref();
  turn.ledger.append({ event: "grandchild", pid: child.pid! });
  await say(turn, "Spawned a grandchild process that ignores SIGTERM.");
  return END_TURN;
});
