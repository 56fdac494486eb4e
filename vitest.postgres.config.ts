import { defineConfig } from "vitest/config";

/**
 * The PostgreSQL pass of `npm test`: suites that drive a whole stack (real Server, Runner and agent
 * processes, or the Server in-process with a real Runner) run again with the Server's state on a real
 * PostgreSQL (scripts/vitest/postgres-pass.ts), so both engines pass the same tests; so do the unit tests of
 * the stores that open their state through test/support/test-state.ts. The engine, schema and admission-store
 * tests run both engines in the main pass.
 */
export default defineConfig({
  test: {
    include: [
      "packages/server/test/runs/crash-matrix-server.test.ts",
      "packages/server/test/mcp/mcp-tasks-restart.test.ts",
      "packages/server/test/tasks/agent-tasks-crash.test.ts",
      "packages/server/test/link/link-acceptance.test.ts",
      "packages/server/test/link/link-takeover.test.ts",
      "packages/server/test/link/link-lease-restart.test.ts",
      "packages/server/test/link/link-trust.test.ts",
      "packages/server/test/link/impersonation-chain.test.ts",
      "packages/server/test/runs/tombstone-acceptance.test.ts",
      "packages/server/test/runs/effective-config.test.ts",
      "packages/server/test/runs/continuation.test.ts",
      "packages/server/test/runs/continuation-paths.test.ts",
      "packages/server/test/runs/continuation-warm.test.ts",
      "packages/server/test/runs/run-usage.test.ts",
      "packages/server/test/runs/workspaces.test.ts",
      "packages/server/test/runs/apply.test.ts",
      "packages/server/test/principals/grant-removal.test.ts",
      "packages/server/test/oauth/oauth-lifecycle.test.ts",
      "packages/server/test/oauth/oauth-sessions.test.ts",
      "packages/server/test/oauth/oauth-negative.test.ts",
      "packages/server/test/oauth/oauth-sdk.test.ts",
      "packages/server/test/link/link-refusal-flood.test.ts",
      "packages/server/test/tls.test.ts",
      "packages/server/test/console/operator-console.test.ts",
      "packages/server/test/console/console-lockout.test.ts",
      // The run core in-process (test/support/in-process.ts Harness) with the Runner's real link.
      "packages/server/test/runs/runs.test.ts",
      "packages/server/test/runs/runs-link-races.test.ts",
      "packages/server/test/link/runner-hub.test.ts",
      "packages/server/test/runs/resend-unacknowledged.test.ts",
      "packages/server/test/http-hardening.test.ts",
      "packages/server/test/test-hooks.test.ts",
      "packages/server/test/wiring/teardown.test.ts",
      // In-process stacks (test/support/stack.ts): the MCP surface of both eras, Tasks, sessions, AgentTasks.
      "packages/server/test/mcp/mcp-acceptance.test.ts",
      "packages/server/test/mcp/mcp-eras.test.ts",
      "packages/server/test/mcp/mcp-refusals.test.ts",
      "packages/server/test/mcp/caps-races.test.ts",
      "packages/server/test/sessions/workflow-sessions.test.ts",
      "packages/server/test/tasks/agent-tasks.test.ts",
      "packages/server/test/tasks/agent-tasks-cli.test.ts",
      // In a real browser: the run view (MCP App), the operator console, the OAuth host flow.
      "packages/server/test/app/run-view-browser.test.ts",
      "packages/server/test/console/console-browser.test.ts",
      "packages/server/test/oauth/oauth-browser.test.ts",
      // Stores over the pass's state engine (test/support/test-state.ts): tokens, audit, sessions, tasks, OAuth.
      "packages/server/test/principals/tokens.test.ts",
      "packages/server/test/mcp/audit.test.ts",
      "packages/server/test/mcp/audit-sync.test.ts",
      "packages/server/test/runs/reconcile.test.ts",
      "packages/server/test/runs/observed-links.test.ts",
      "packages/server/test/sessions/session-terminal-evidence.test.ts",
      "packages/server/test/sessions/session-retention.test.ts",
      "packages/server/test/tasks/task-claim.test.ts",
      "packages/server/test/oauth/oauth-store.test.ts",
      "packages/server/test/oauth/oauth-hosts.test.ts",
      // Signed webhooks through the whole stack, and across a kill -9 of the Server.
      "packages/server/test/webhooks/webhooks-stack.test.ts",
      "packages/server/test/webhooks/webhooks-crash.test.ts",
      "packages/server/test/webhooks/webhooks-tasks.test.ts",
      "packages/server/test/webhooks/webhooks-manage.test.ts",
      "packages/server/test/webhooks/webhooks-tools.test.ts",
    ],
    globalSetup: ["./scripts/vitest/build.ts", "./scripts/vitest/postgres-pass.ts"],
    pool: "forks",
    // Sized for a machine 3x slower than a quiet one (a shared 2-core box under load): a test or hook that
    // needs more than a third of this on a quiet machine sets its own, 3x its quiet time (docs/testing.md).
    testTimeout: 90_000,
    hookTimeout: 90_000,
    maxWorkers: 2,
    reporters: ["default", "./scripts/vitest/summary-reporter.ts"],
  },
});
