/**
 * Issue 41 (design §16) through the whole stack: a real Server, a real Runner daemon with a `worktree` project
 * (a git repository) and the fake agent. Two concurrent runs editing the same file each get a change of their
 * own; observe shows each run's workspace; get_coding_agent_changes answers the owner on both MCP eras, and
 * another principal exactly as for a run that does not exist. The diff is project content: it never reaches the
 * Server's state or its log.
 */
import { Client as ModernClient, StreamableHTTPClientTransport as ModernTransport } from "@modelcontextprotocol/client";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";
import { type Stack, startStack } from "../support/stack.js";
import { observeToEnd, ok, type Structured, toolError } from "../support/tool-calls.js";

const ALL = ["coding_agent:run", "project:write", "project:read", "runtime:read"] as const;
const MODERN = "2026-07-28";
const CHANGES = "get_coding_agent_changes";

let stack: Stack;
let alice: Client;
let bob: Client;
let modern: ModernClient;

beforeAll(async () => {
  stack = await startStack({
    principals: [
      { id: "alice", scopes: [...ALL], projects: ["demo"] },
      { id: "bob", scopes: [...ALL], projects: ["demo"] },
    ],
    projects: [{ id: "demo", allow_patch: true, workspace: "worktree" }],
    acp: { max_concurrent_runs: 4 },
  });
  const aliceToken = await stack.issueToken("alice", [...ALL], ["demo"]);
  alice = await stack.connect(aliceToken);
  bob = await stack.connect(await stack.issueToken("bob", [...ALL], ["demo"]));
  modern = new ModernClient(
    { name: "webcodex-test-2026", version: "0" },
    { versionNegotiation: { mode: { pin: MODERN } } },
  );
  await modern.connect(
    new ModernTransport(stack.mcpUrl, { requestInit: { headers: { Authorization: `Bearer ${aliceToken}` } } }),
  );
}, 120_000);

afterAll(async () => {
  await modern?.close();
  await stack?.stop();
});

let counter = 0;
const unique = (label: string) => `${label}-${process.pid}-${++counter}`;

async function modernChanges(args: Record<string, unknown>): Promise<Structured> {
  const r = (await modern.callTool({ name: CHANGES, arguments: args }, { timeout: 60_000 })) as {
    isError?: boolean;
    structuredContent?: Structured;
  };
  expect(r.isError).toBeFalsy();
  return r.structuredContent as Structured;
}

describe("workspaces through the stack", () => {
  it("two concurrent runs editing the same file each get their own change, read by their owner only", async () => {
    const textA = canary("ws-a");
    const textB = canary("ws-b");
    const start = (text: string) =>
      ok(alice, "start_coding_agent", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: unique("ws"),
        prompt: `scenario: edit_file path=README.md text=${text} hold=true`,
      });
    const a = (await start(textA)).run_id as string;
    const b = (await start(textB)).run_id as string;
    // Both agents have written their edit while both runs are live (each holds until cancelled).
    await poll(() => stack.ledger().filter((l) => l.event === "file_edited").length >= 2, {
      timeoutMs: DAEMON_WAIT_MS * 3,
      intervalMs: DAEMON_POLL_MS,
      what: "both runs' edits",
    });
    // While it runs, a run's change is not recorded yet: only its base and branch are known.
    const pending = await ok(alice, CHANGES, { run_id: a });
    expect(pending).toMatchObject({ run_id: a, recorded: false, files: [], diff: "" });
    expect(pending.head_commit).toBeUndefined();

    await ok(alice, "cancel_coding_agent", { run_id: a });
    await ok(alice, "cancel_coding_agent", { run_id: b });
    const endA = await observeToEnd(alice, a);
    const endB = await observeToEnd(alice, b);
    for (const [end, runId] of [
      [endA, a],
      [endB, b],
    ] as const) {
      expect(end.state).toBe("cancelled");
      expect(end.workspace).toMatchObject({ mode: "worktree", branch: `webcodex/run/${runId}` });
      const ws = end.workspace as Record<string, string>;
      expect(ws.head_commit).toMatch(/^[0-9a-f]{40}$/);
      expect(ws.head_commit).not.toBe(ws.base_commit);
    }
    expect((endA.workspace as Structured).base_commit).toBe((endB.workspace as Structured).base_commit);

    for (const [runId, mine, theirs] of [
      [a, textA, textB],
      [b, textB, textA],
    ] as const) {
      const changes = await ok(alice, CHANGES, { run_id: runId });
      expect(changes).toMatchObject({
        run_id: runId,
        recorded: true,
        branch: `webcodex/run/${runId}`,
        files: [{ path: "README.md", status: "modified", insertions: 1, deletions: 1, binary: false }],
        files_truncated: false,
        diff_truncated: false,
      });
      expect(changes.diff).toContain(`+${mine}`);
      expect(changes.diff).toContain("-demo");
      expect(changes.diff).not.toContain(theirs);
    }

    // The 2026-07-28 era answers the same; a small max_bytes pages the diff.
    const full = await ok(alice, CHANGES, { run_id: a });
    const first = await modernChanges({ run_id: a, max_bytes: 1024 });
    expect(first.files).toEqual(full.files);
    let diff = first.diff as string;
    let cursor = first.next_cursor as string | undefined;
    while (cursor !== undefined) {
      const page = await modernChanges({ run_id: a, max_bytes: 1024, cursor });
      diff += page.diff as string;
      cursor = page.next_cursor as string | undefined;
    }
    expect(diff).toBe(full.diff);

    // Another principal: exactly as for a run that does not exist.
    const denied = await toolError(bob, CHANGES, { run_id: a });
    const missing = await toolError(bob, CHANGES, { run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa" });
    expect(denied.code).toBe("not_found");
    expect(denied.message.replace(a, "RUN")).toBe(
      missing.message.replace("wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa", "RUN"),
    );

    // Bad input is refused precisely.
    const badCursor = await toolError(alice, CHANGES, { run_id: a, cursor: "-1" });
    expect(badCursor.code).toBe("invalid_input");
    expect(badCursor.message).toContain("cursor");
    const badRef = await toolError(alice, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: unique("ref"),
      prompt: "scenario: hello",
      base_ref: "--upload-pack=touch",
    });
    expect(badRef.code).toBe("invalid_input");
    expect(badRef.message).toContain("base_ref: must be a branch, tag or commit of the project");

    // The change is project content: not in the Server's state, not in its log.
    const state = await stack.stateText();
    const log = stack.serverLog();
    for (const text of [textA, textB]) {
      expect(state).not.toContain(text);
      expect(log).not.toContain(text);
    }
  }, 240_000);

  it("carries base_ref to the Runner: a named branch is the run's base, an unknown one ends the run failed / not_started, and it is part of the intent", async () => {
    const key = unique("base");
    const started = await ok(alice, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: key,
      prompt: "scenario: edit_file path=b.txt text=b",
      base_ref: "main",
    });
    const end = await observeToEnd(alice, started.run_id as string);
    expect(end.state).toBe("completed");
    const ws = end.workspace as Record<string, string>;
    expect(ws.base_commit).toMatch(/^[0-9a-f]{40}$/);
    const changes = await ok(alice, CHANGES, { run_id: started.run_id });
    expect(changes.base_commit).toBe(ws.base_commit);
    expect((changes.files as Structured[]).map((f) => f.path)).toEqual(["b.txt"]);

    // The same key with another base_ref is another intent.
    const conflict = await toolError(alice, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: key,
      prompt: "scenario: edit_file path=b.txt text=b",
      base_ref: "v9",
    });
    expect(conflict.code).toBe("idempotency_conflict");

    const unknown = await ok(alice, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: unique("base"),
      prompt: "scenario: hello",
      base_ref: "no-such-branch",
    });
    const failed = await observeToEnd(alice, unknown.run_id as string);
    expect(failed).toMatchObject({
      state: "failed",
      execution_state: "not_started",
      failure_kind: "workspace_failed",
      recovery_kind: "fix_input",
    });
    expect(failed.message).toContain("base_ref names no branch, tag or commit of the project.");
  }, 240_000);
});
