/**
 * Issue 41 §3: the seeded chaos in workspace mode (support/workspace-chaos.ts says what it does and checks). A real
 * Server child, a real Runner child whose one project is a `worktree` project (a git repository with one commit),
 * and the fake agent running as the Runner's user: each run works in a linked worktree under the Runner's
 * `<state_dir>/workspaces`. The run_as variant (a repository of its own per run, owned by a pool user) is
 * seeded-chaos-workspaces-run-as.test.ts.
 */
import { join } from "node:path";
import { afterAll, beforeAll, describe, it } from "vitest";
import { ProcStack } from "../../../packages/server/test/support/proc-stack.js";
import { seed, size } from "./support/profile.js";
import { workspaceChaos } from "./support/workspace-chaos.js";

/** WEBCODEX_CHAOS_ITERATIONS changes the count for a local try. */
const ITERATIONS = Number(process.env.WEBCODEX_CHAOS_ITERATIONS) || size(60, 4);

describe("seeded chaos, workspace mode: kills, restarts, replays and cancels of worktree runs", () => {
  let stack: ProcStack;

  beforeAll(async () => {
    stack = await new ProcStack({
      server: "child",
      runners: [{ id: "r1", projects: ["p1"], worktreeProjects: ["p1"] }],
    }).init();
    await stack.startRunner("r1");
  });

  afterAll(async () => {
    await stack?.stop();
  });

  it(
    `loses no change and leaves no worktree through ${ITERATIONS} seeded iterations`,
    () =>
      workspaceChaos(stack, {
        label: "workspaces",
        iterations: ITERATIONS,
        seed: seed(),
        workspacesDir: join(stack.dir, "runner-state-r1", "workspaces"),
      }),
    10 * 60_000,
  );
});
