/**
 * `webcodex session show` prints text another run wrote (handoff, goal, title) and the Server's evidence
 * entries: every field goes through terminal-text.ts like the run output, so none of it can drive the
 * terminal or reorder what a reader sees, in text or in --json.
 */
import { describe, expect, it } from "vitest";
import { sessionCommand } from "../src/commands/session.js";
import type { RunsClient } from "../src/server-client.js";
import { parseSessionCommand } from "../src/session-args.js";
import { scriptedClient, testContext } from "./support.js";

const ESC = "\u001b";
const RLO = "\u202e";
const DEL = "\u007f";

function clientAnswering(value: unknown): RunsClient {
  const base = scriptedClient({ start: {} as never, observations: [] } as never);
  return { ...base, callTool: async (_name, _args, schema) => schema.parse(value) };
}

const read = {
  session_id: "wc_sess_aaaaaaaaaaaaaaaaaaaaaaaaaa",
  project_id: "demo",
  title: `t${ESC}]0;owned${ESC}\\`,
  handoff: `line one\nline ${RLO}two${DEL}`,
  handoff_version: 2,
  goal: `goal ${ESC}[2J`,
  goal_version: 1,
  version: 3,
  evidence: [
    {
      seq: 1,
      at: "2026-11-30T00:00:00.000Z",
      kind: `coding_agent_started${ESC}[31m`,
      run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa",
      state: `completed${RLO}`,
      stop_reason: `end_turn${ESC}`,
    },
  ],
  evidence_dropped: 0,
  has_more: false,
};

async function show(json: boolean): Promise<string> {
  const parsed = parseSessionCommand(["show", read.session_id, ...(json ? ["--json"] : [])]);
  if (!parsed) throw new Error("not parsed");
  const { ctx, stdout } = testContext(clientAnswering(read));
  expect(await sessionCommand(parsed.global, parsed.session, ctx)).toBe(0);
  return stdout.text;
}

describe("webcodex session show", () => {
  it("shows handoff, goal, title and every evidence field with terminal controls made visible", async () => {
    const out = await show(false);
    for (const raw of [ESC, RLO, DEL]) expect(out).not.toContain(raw);
    expect(out).toContain("t\\x1b]0;owned\\x1b\\");
    expect(out).toContain("goal \\x1b[2J");
    expect(out).toContain("line one\nline \\u202etwo\\x7f");
    expect(out).toContain("coding_agent_started\\x1b[31m");
    expect(out).toContain("completed\\u202e · end_turn\\x1b");
  });

  it("writes --json with no raw DEL, C1 or bidi control, and the same data for a JSON reader", async () => {
    const out = await show(true);
    for (const raw of [ESC, RLO, DEL]) expect(out).not.toContain(raw);
    const line = JSON.parse(out) as typeof read & { type: string };
    expect(line.type).toBe("session");
    expect(line.handoff).toBe(read.handoff);
    expect(line.evidence[0]?.kind).toBe(read.evidence[0]?.kind);
  });
});
