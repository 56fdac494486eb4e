/**
 * A second Server instance beside a ProcStack's (cluster tests, design §14): instance B is the stack's Server
 * config on another port and the same database, started as a `webcodex-server run` child with the test API on;
 * and that API's run calls, asked of either instance by port.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { expect } from "vitest";
import {
  DAEMON_POLL_MS,
  DAEMON_WAIT_MS,
  type DaemonProcess,
  poll,
  startServerProcess,
} from "../../../../scripts/test-support/index.js";
import type { ApiResult } from "../../src/runs/api.js";
import { type ProcStack, STATE_URL_ENV } from "./proc-stack.js";

/** How long stopping instance B gives it after SIGTERM before SIGKILL. */
const STOP_GRACE_MS = 5_000;

/** Instance B on `port` (extra `env` for its test hooks), once it listens; it exiting first is an error. */
export async function startInstanceB(
  s: ProcStack,
  port: number,
  env: Record<string, string> = {},
): Promise<DaemonProcess> {
  const config = join(s.dir, "server-b.toml");
  writeFileSync(config, readFileSync(s.serverConfigFile, "utf8").replace(/^port = \d+$/m, `port = ${port}`));
  const child = startServerProcess(config, {
    cwd: s.dir,
    env: {
      ...process.env,
      WEBCODEX_TEST_HOOK_API: "1",
      WEBCODEX_LOG_LEVEL: "warn",
      [STATE_URL_ENV]: s.stateUrl ?? "",
      ...env,
    },
    stopGraceMs: STOP_GRACE_MS,
  });
  await poll(
    () => {
      if (child.exitCode !== null) throw new Error(`instance B exited ${child.exitCode}: ${child.output()}`);
      return child.output().includes('"listening"');
    },
    { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "instance B to listen" },
  );
  return child;
}

/** Alice's start, observe or cancel through the test API of the instance at `port`. */
export async function instanceApi<T>(
  port: number,
  op: "start" | "observe" | "cancel",
  input: unknown,
): Promise<ApiResult<T>> {
  const res = await fetch(`http://127.0.0.1:${port}/__test/runs/${op}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ principal_id: "alice", input }),
  });
  expect(res.status).toBe(200);
  return (await res.json()) as ApiResult<T>;
}
