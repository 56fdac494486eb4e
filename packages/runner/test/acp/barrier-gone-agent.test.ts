/**
 * Issue 12 §5: the barrier is not crossed when the agent is already gone.
 * An agent that answered session/new and then exited (or closed its stdout)
 * during setup cannot receive a prompt: the run ends failed/not_started and
 * the store never records the dispatch barrier. The turn runs over a child
 * made of in-memory streams (the spawn seam), the real store.
 */
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import type { Terminal } from "../../src/acp/terminal.js";
import { AcpTurn } from "../../src/acp/turn.js";
import type { TurnEvent } from "../../src/acp/turn-events.js";
import { EventRing } from "../../src/events/ring.js";
import { silentLogger } from "../../src/logger.js";
import type { AgentChild, ChildExit } from "../../src/process/spawn.js";
import { openDispatchStore } from "../../src/store/open.js";
import { makeWorkspace, newRunId, writeConfig } from "../support/harness.js";

const ws = makeWorkspace();
afterAll(() => ws.cleanup());

/** A child that answers initialize and session/new (and a prompt with end_turn), then is `gone` after session/new. */
function goneAfterSessionNew(gone: "exited" | "stdout_closed"): AgentChild & { prompts: number } {
  const encoder = new TextEncoder();
  let out!: ReadableStreamDefaultController<Uint8Array>;
  let exit: ChildExit | null = null;
  let buffered = "";
  const child = {
    prompts: 0,
    pid: 0,
    pgid: 0,
    startTime: null,
    stdout: new ReadableStream<Uint8Array>({
      start(controller) {
        out = controller;
      },
    }),
    stdin: new WritableStream<Uint8Array>({
      write(chunk) {
        buffered += new TextDecoder().decode(chunk);
        for (let nl = buffered.indexOf("\n"); nl >= 0; nl = buffered.indexOf("\n")) {
          const req = JSON.parse(buffered.slice(0, nl)) as { id: number; method: string };
          buffered = buffered.slice(nl + 1);
          const reply = (result: unknown) =>
            out.enqueue(encoder.encode(`${JSON.stringify({ jsonrpc: "2.0", id: req.id, result })}\n`));
          if (req.method === "initialize") reply({ protocolVersion: 1, agentCapabilities: {}, authMethods: [] });
          if (req.method === "session/new") {
            reply({ sessionId: "s1" });
            // Gone right after its answer, before the Runner would dispatch.
            if (gone === "exited") exit = { code: 1, signal: null };
            else out.close();
          }
          if (req.method === "session/prompt") {
            child.prompts++;
            reply({ stopReason: "end_turn" });
          }
        }
      },
    }),
    exited: new Promise<ChildExit>(() => {}),
    get exit() {
      return exit;
    },
    stderrBytes: 0,
    stderrTail: () => "",
    terminateTree: async () => ({ escalation: "eof" as const, survivors: 0 }),
  };
  return child;
}

describe("no barrier for an agent already gone", () => {
  it.each([
    ["exited", "provider_exited"],
    ["stdout_closed", "stdout_closed"],
  ] as const)("an agent %s after session/new: failed/not_started (%s), no barrier, no prompt", async (gone, kind) => {
    const config = writeConfig(ws);
    const { store } = openDispatchStore({ stateDir: mkdtempSync(join(tmpdir(), "wc-barrier-")) });
    const child = goneAfterSessionNew(gone);
    const project = config.projects[0];
    const agent = config.acp.agents[0];
    if (!project || !agent) throw new Error("config");
    const runId = newRunId();
    store.admit({
      run_id: runId,
      intent_fingerprint: "f".repeat(64),
      project_id: project.id,
      provider_id: agent.id,
      provider_instance_id: "pi_aaaaaaaaaaaaaaaa",
      agent_instance_id: "ai_aaaaaaaaaaaaaaaa",
      created_at: new Date().toISOString(),
    });
    const turn = new AcpTurn(
      {
        acp: config.acp,
        store,
        log: silentLogger(),
        sourceEnv: process.env,
        maxMessageBytes: undefined,
        failpoint: () => {},
        // A spawn seam keeps spawnAgent's contract: `onStarted` once the child is started, before it resolves.
        spawn: async (options) => {
          options.onStarted?.(child.pid, child.startTime);
          return child;
        },
      },
      {
        runId,
        project,
        cwd: project.root,
        continueSessionId: null,
        agent,
        runAs: null,
        timeoutSecs: 60,
        prompt: "scenario: hello",
        callerConfig: {},
        ring: new EventRing(undefined, () => new Date()),
      },
    );
    const told: TurnEvent[] = [];
    const events = turn.events();
    let terminal: Terminal | undefined;
    for (let next = await events.next(); terminal === undefined; next = await events.next()) {
      if (next.done) terminal = next.value;
      else told.push(next.value);
    }
    const kinds = told.map((e) => e.kind);
    expect(terminal).toMatchObject({ state: "failed", execution_state: "not_started", failure_kind: kind });
    expect(terminal.message).toMatch(/Stage: prompt\. No prompt was dispatched\./);
    expect(kinds).toContain("setup");
    expect(kinds).not.toContain("dispatched");
    expect(store.get(runId)?.phase).toBe("setup");
    expect(child.prompts).toBe(0);
    for (const e of told) if (e.kind === "setup") e.conn.close();
    store.close();
  });
});
