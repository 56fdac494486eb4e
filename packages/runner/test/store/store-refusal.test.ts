import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { STORE_DB_FILE, STORE_MARKER_FILE } from "../../src/store/open.js";
import {
  killAllRunners,
  makeSandbox,
  type Sandbox,
  startRunner,
  startTestServer,
  type TestServer,
} from "../support/crash-matrix-harness.js";

// The Runners need a Server to connect to (`run` requires [server]); this one just answers hello.
let server: TestServer | undefined;
beforeAll(async () => {
  server = await startTestServer();
});
afterAll(async () => {
  await server?.close();
});

const sandboxes: Sandbox[] = [];
afterEach(async () => {
  await killAllRunners();
  for (const s of sandboxes.splice(0)) s.cleanup();
});

function sandbox(): Sandbox {
  const s = makeSandbox({ serverUrl: server!.url });
  sandboxes.push(s);
  return s;
}

function markerStoreId(s: Sandbox): string | null {
  try {
    return JSON.parse(readFileSync(join(s.stateDir, STORE_MARKER_FILE), "utf8")).store_id as string;
  } catch {
    return null;
  }
}

/** Start the real Runner once so it creates its store, then stop it gracefully. */
async function createStore(s: Sandbox, newStore = false): Promise<string> {
  const runner = startRunner(s, { newStore });
  await poll(() => runner.output().includes('"runner started"'), { timeoutMs: DAEMON_WAIT_MS, what: "runner start" });
  await runner.stop();
  const id = markerStoreId(s);
  if (!id) throw new Error("no store marker written");
  return id;
}

async function expectRefusal(s: Sandbox, what: RegExp): Promise<void> {
  const runner = startRunner(s);
  const { code } = await runner.exited;
  expect(code).toBe(3);
  const stderr = runner.output();
  expect(stderr).toContain(join(s.stateDir, STORE_DB_FILE));
  expect(stderr).toContain("--new-store");
  expect(stderr).toMatch(what);
}

describe("store refusal (real webcodex-runner run)", { timeout: 90_000 }, () => {
  it("refuses to start when the database was deleted after use (marker present)", async () => {
    const s = sandbox();
    await createStore(s);
    rmSync(join(s.stateDir, STORE_DB_FILE));
    await expectRefusal(s, /is missing/);
  });

  it("refuses to start on a truncated database", async () => {
    const s = sandbox();
    await createStore(s);
    writeFileSync(join(s.stateDir, STORE_DB_FILE), "");
    await expectRefusal(s, /cannot be opened|integrity/);
  });

  it("refuses to start on an overwritten database", async () => {
    const s = sandbox();
    await createStore(s);
    writeFileSync(join(s.stateDir, STORE_DB_FILE), Buffer.alloc(64 * 1024, "garbage!"));
    await expectRefusal(s, /cannot be opened|integrity/);
  });

  it("refuses a second Runner on the same state dir while the first one runs", async () => {
    const s = sandbox();
    const first = startRunner(s);
    await poll(() => first.output().includes('"runner started"'), { timeoutMs: DAEMON_WAIT_MS, what: "runner start" });
    const second = startRunner(s);
    const { code } = await second.exited;
    expect(code).toBe(3);
    expect(second.output()).toContain("in use by another process");
    expect(first.child.exitCode).toBeNull();
    await first.stop();
    expect((await first.exited).code).toBe(0);
  });

  it("starts a fresh store with a new store_id on --new-store, moving the old one aside", async () => {
    const s = sandbox();
    const first = await createStore(s);
    rmSync(join(s.stateDir, STORE_DB_FILE));
    await expectRefusal(s, /is missing/);
    const second = await createStore(s, true);
    expect(second).not.toBe(first);
    // And it is stable afterwards.
    expect(await createStore(s)).toBe(second);
  });
});
