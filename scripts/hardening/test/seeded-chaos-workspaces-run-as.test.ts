/**
 * Issue 41 §3: the seeded chaos in workspace mode, run_as variant (support/workspace-chaos.ts says what it does and
 * checks). A real Server child, a real Runner child whose one project is a `worktree` project, and the fake agent
 * run as a pool of two real OS users: each run works in a repository of its own, owned by its pool user, in the
 * Runner's `workspaces_dir` (workspace/owned.ts), and its change is recorded through a scratch repository of the
 * Runner's and packed into the project. The agents' sandbox (`namespaces` or `none`) is drawn from the seed.
 *
 * Creating users and switching to them needs root (CI runs the suite as root): as any other user this file's test
 * is skipped, and the describe title says why.
 */
import { chmodSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, it } from "vitest";
import { sweepUser } from "../../../packages/runner/src/process/user-pool.js";
import { agentCopy, createTestUser, IS_ROOT, type TestUser } from "../../../packages/runner/test/support/test-user.js";
import { ProcStack } from "../../../packages/server/test/support/proc-stack.js";
import { seed, size } from "./support/profile.js";
import { workspaceChaos } from "./support/workspace-chaos.js";

/** WEBCODEX_CHAOS_ITERATIONS changes the count for a local try. */
const ITERATIONS = Number(process.env.WEBCODEX_CHAOS_ITERATIONS) || size(24, 5);
/** The Runner's `workspaces_dir`, relative to its config (the stack's dir). */
const WORKSPACES = "workspaces";

describe.skipIf(!IS_ROOT)(
  "seeded chaos, run_as workspace mode: kills, restarts, replays and cancels of pool users' runs (needs root to create users)",
  () => {
    const s = seed();
    const sandbox = s % 2 === 0 ? "namespaces" : "none";
    let users: TestUser[] = [];
    let agent: ReturnType<typeof agentCopy> | undefined;
    let stack: ProcStack | undefined;

    beforeAll(async () => {
      users = [createTestUser("x1"), createTestUser("x2")];
      agent = agentCopy();
      stack = await new ProcStack({
        server: "child",
        runners: [
          {
            id: "r1",
            projects: ["p1"],
            worktreeProjects: ["p1"],
            runAs: { user: users.map((u) => u.name), agentBin: agent.bin },
          },
        ],
        runnerTable: `workspaces_dir = ${JSON.stringify(WORKSPACES)}`,
        // Alice's runs may hold both users: a run's user is let go only after its end is reported.
        acpTable: `sandbox = ${JSON.stringify(sandbox)}\nmax_users_per_caller = 2`,
      }).init();
      // The pool users' agents append to the ledger; the project stays the operator's, readable to them.
      writeFileSync(stack.ledgerFile("r1"), "");
      chmodSync(stack.ledgerFile("r1"), 0o666);
      await stack.startRunner("r1");
    });

    afterAll(async () => {
      await stack?.stop();
      for (const user of users) await sweepUser(user.uid);
      for (const user of users) user.remove();
      agent?.remove();
    });

    it(
      `loses no change and leaves no owned repository through ${ITERATIONS} seeded iterations (sandbox = "${sandbox}")`,
      () => {
        if (!stack) throw new Error("no stack");
        return workspaceChaos(stack, {
          label: `workspaces, run_as, sandbox ${sandbox}`,
          iterations: ITERATIONS,
          seed: s,
          workspacesDir: join(stack.dir, WORKSPACES),
        });
      },
      10 * 60_000,
    );
  },
);
