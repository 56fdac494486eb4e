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
      "packages/server/test/crash-matrix-server.test.ts",
      "packages/server/test/mcp-tasks-restart.test.ts",
      "packages/server/test/agent-tasks-crash.test.ts",
      "packages/server/test/link-acceptance.test.ts",
      "packages/server/test/link-takeover.test.ts",
      "packages/server/test/link-lease-restart.test.ts",
      "packages/server/test/link-trust.test.ts",
      "packages/server/test/impersonation-chain.test.ts",
      "packages/server/test/tombstone-acceptance.test.ts",
      "packages/server/test/effective-config.test.ts",
      "packages/server/test/run-usage.test.ts",
      "packages/server/test/grant-removal.test.ts",
      "packages/server/test/oauth-lifecycle.test.ts",
      "packages/server/test/oauth-sessions.test.ts",
      "packages/server/test/oauth-negative.test.ts",
      "packages/server/test/oauth-sdk.test.ts",
      "packages/server/test/link-refusal-flood.test.ts",
      "packages/server/test/tls.test.ts",
      "packages/server/test/operator-console.test.ts",
      "packages/server/test/console-lockout.test.ts",
      // The run core in-process (test/support/in-process.ts Harness) with the Runner's real link.
      "packages/server/test/runs.test.ts",
      "packages/server/test/runs-link-races.test.ts",
      "packages/server/test/runner-hub.test.ts",
      "packages/server/test/resend-unacknowledged.test.ts",
      "packages/server/test/http-hardening.test.ts",
      "packages/server/test/test-hooks.test.ts",
      // In-process stacks (test/support/stack.ts): the MCP surface of both eras, Tasks, sessions, AgentTasks.
      "packages/server/test/mcp-acceptance.test.ts",
      "packages/server/test/mcp-eras.test.ts",
      "packages/server/test/caps-races.test.ts",
      "packages/server/test/workflow-sessions.test.ts",
      "packages/server/test/agent-tasks.test.ts",
      "packages/server/test/agent-tasks-cli.test.ts",
      // In a real browser: the run view (MCP App), the operator console, the OAuth host flow.
      "packages/server/test/run-view-browser.test.ts",
      "packages/server/test/console-browser.test.ts",
      "packages/server/test/oauth-browser.test.ts",
      // Stores over the pass's state engine (test/support/test-state.ts): tokens, audit, sessions, tasks, OAuth.
      "packages/server/test/tokens.test.ts",
      "packages/server/test/audit.test.ts",
      "packages/server/test/audit-sync.test.ts",
      "packages/server/test/reconcile.test.ts",
      "packages/server/test/session-terminal-evidence.test.ts",
      "packages/server/test/session-retention.test.ts",
      "packages/server/test/task-claim.test.ts",
      "packages/server/test/oauth-store.test.ts",
      "packages/server/test/oauth-hosts.test.ts",
      // Signed webhooks through the whole stack, and across a kill -9 of the Server.
      "packages/server/test/webhooks/webhooks-stack.test.ts",
      "packages/server/test/webhooks/webhooks-crash.test.ts",
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
