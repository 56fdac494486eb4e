/**
 * A Runner's true capacity reason reaches the caller (issue 39 §3): real Server, real Runner daemons whose
 * fake agent runs as a run_as pool of real OS users, real MCP clients. The Runner says why it refused
 * (`capacity_reason`, a closed set) and the caller's tool error says it too, in the Server's own words, with a
 * recovery_kind that tells whether retrying can help — not one generic "retry later".
 *
 * Needs root to create the pool users (CI runs as root); skipped otherwise.
 */
import { chmodSync, writeFileSync } from "node:fs";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { CAPACITY_REASONS } from "@webcodex/protocol";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { agentCopy, createTestUser, IS_ROOT, type TestUser } from "../../../runner/test/support/test-user.js";
import { ProcStack } from "../support/proc-stack.js";
import { ok, toolError } from "../support/tool-calls.js";

/** A run that lives until cancelled (60 s at most). */
const SLOW = "scenario: slow interval_ms=100 count=600";

describe.skipIf(!IS_ROOT)(
  "capacity reasons through the whole stack (needs root to create pool users)",
  { timeout: 180_000 },
  () => {
    let users: TestUser[] = [];
    let agent: ReturnType<typeof agentCopy>;
    let s: ProcStack | undefined;
    beforeAll(() => {
      users = [createTestUser("c1"), createTestUser("c2"), createTestUser("c3")];
      agent = agentCopy();
    });
    afterAll(() => {
      for (const u of users) u.remove();
      agent?.remove();
    });
    afterEach(async () => {
      await s?.stop();
      s = undefined;
    });

    const start = (_client: Client, project: string, key: string, prompt = SLOW) =>
      ({ project_id: project, provider_id: "fake", idempotency_key: key, prompt }) as const;

    it("caller_limit, pool_busy and pool_bound each reach the MCP caller with their own words and recovery", async () => {
      s = await new ProcStack({
        runners: [
          // A pool of two: one caller holds at most one (half the pool).
          { id: "r1", projects: ["p1"], runAs: { user: [users[0]!.name, users[1]!.name], agentBin: agent.bin } },
          // A pool of one.
          { id: "r2", projects: ["p2"], runAs: { user: users[2]!.name, agentBin: agent.bin } },
        ],
        // A Server child process: it mounts /mcp (the in-process Server of the stack does not).
        server: "child",
      }).init();
      chmodSync(s.dir, 0o711);
      for (const id of ["r1", "r2"]) {
        writeFileSync(s.ledgerFile(id), "");
        chmodSync(s.ledgerFile(id), 0o666);
      }
      await s.startRunner("r1");
      await s.startRunner("r2");
      const alice = await s.mcp("alice");
      const bob = await s.mcp("bob");

      // Alice's first run takes one of r1's two users; her second is refused: she holds her share.
      const a1 = await ok(alice, "start_coding_agent", start(alice, "p1", "a1"));
      const limited = await toolError(alice, "start_coding_agent", start(alice, "p1", "a2"));
      expect(limited).toEqual({
        code: "capacity",
        message: `${CAPACITY_REASONS.caller_limit.summary} Nothing was started. Retry with the same key when one of your own runs on this Runner has ended.`,
        recovery_kind: "retry_same",
        capacity_reason: "caller_limit",
      });
      // Bob still gets r1's other user.
      const b1 = await ok(bob, "start_coding_agent", start(bob, "p1", "b1"));

      // r2's one user serves alice's live run: bob is told the pool is busy, and that retrying helps.
      const a3 = await ok(alice, "start_coding_agent", start(alice, "p2", "a3"));
      const busy = await toolError(bob, "start_coding_agent", start(bob, "p2", "b2"));
      expect(busy).toMatchObject({ code: "capacity", capacity_reason: "pool_busy", recovery_kind: "retry_same" });
      expect(busy.message).toContain(CAPACITY_REASONS.pool_busy.summary);

      // Alice's run ends; r2's user is free but hers: bob is told why, and that retrying soon will not help.
      for (const [who, run] of [
        ["alice", a1],
        ["bob", b1],
        ["alice", a3],
      ] as const) {
        await s.cancel(who, { run_id: run.run_id as string });
        await s.untilTerminal(run.run_id as string, who);
      }
      // The user is free once its sweep is done, which may follow the run's terminal state by a moment: until
      // then the answer is pool_busy (retrying helps), so ask again while it is.
      const bound = await poll(
        async () => {
          const e = await toolError(bob, "start_coding_agent", start(bob, "p2", "b3"));
          return e.capacity_reason === "pool_busy" ? undefined : e;
        },
        { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "r2's user to be swept and free" },
      );
      expect(bound).toEqual({
        code: "capacity",
        message: `${CAPACITY_REASONS.pool_bound.summary} Nothing was started. Retrying soon will not help: ask the Runner's operator to add users to the agent's run_as pool or to release one (webcodex-runner pool release).`,
        recovery_kind: "none",
        capacity_reason: "pool_bound",
      });
      // Alice's own user serves her again.
      const a4 = await ok(alice, "start_coding_agent", start(alice, "p2", "a4", "scenario: hello"));
      expect((await s.untilTerminal(a4.run_id as string, "alice")).state).toBe("completed");
    });
  },
);
