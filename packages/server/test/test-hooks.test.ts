/** The test-only /__test API: loopback only, announced in the listening log, and no error echo. */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { buildServerConfig, isLoopbackHost } from "../src/config.js";
import { type RunningServer, startServer } from "../src/server.js";
import { TEST_API_ENV } from "../src/test-api.js";
import { captureLogger } from "./support/in-process.js";

describe("test hook API", () => {
  const dir = mkdtempSync(join(tmpdir(), "wc-hooks-"));
  let server: RunningServer | undefined;
  afterEach(async () => {
    await server?.close();
    server = undefined;
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const config = (host: string) =>
    buildServerConfig(
      { server: { host, port: 0, state_dir: "state" }, principals: [{ id: "alice", scopes: ["project:read"] }] },
      { file: null, baseDir: dir },
    );

  it("refuses to start on a non-loopback host", async () => {
    const log = captureLogger();
    await expect(
      startServer({ config: config("0.0.0.0"), logger: log.logger, env: { [TEST_API_ENV]: "1" } }),
    ).rejects.toThrow(/loopback/);
    expect(isLoopbackHost("127.0.0.1") && isLoopbackHost("::1") && isLoopbackHost("localhost")).toBe(true);
    expect(isLoopbackHost("0.0.0.0") || isLoopbackHost("::") || isLoopbackHost("192.168.1.2")).toBe(false);
  });

  it("says test_hooks in the listening line and does not echo error messages", async () => {
    const log = captureLogger();
    server = await startServer({ config: config("127.0.0.1"), logger: log.logger, env: { [TEST_API_ENV]: "1" } });
    const listening = log.lines.map((l) => JSON.parse(l)).find((l) => l.msg === "server listening");
    expect(listening?.test_hooks).toBe(true);
    const res = await fetch(`${server.url}/__test/runs/start`, { method: "POST", body: '{"principal_id": ECHO-ME' });
    expect(res.status).toBe(500);
    const text = await res.text();
    expect(JSON.parse(text)).toEqual({ error: "internal" });
    expect(text).not.toContain("JSON");
    expect(text).not.toContain("ECHO");
  });

  it("validates a start with the run core's StartInput schema before the run core sees it", async () => {
    server = await startServer({
      config: config("127.0.0.1"),
      logger: captureLogger().logger,
      env: { [TEST_API_ENV]: "1" },
    });
    const start = async (input: Record<string, unknown>) => {
      const res = await fetch(`${server?.url}/__test/runs/start`, {
        method: "POST",
        body: JSON.stringify({ principal_id: "alice", input }),
      });
      return res.json();
    };
    const valid = { project_id: "demo", provider_id: "fake", idempotency_key: "k", prompt: "hi" };
    expect(await start({ ...valid, timeout_secs: 0.5 })).toEqual({
      ok: false,
      error: { code: "invalid_input", message: "timeout_secs: must be an integer", recovery_kind: "fix_input" },
    });
    expect(await start({ ...valid, workflow_session_id: `wc_sess_${"a".repeat(26)}` })).toMatchObject({
      ok: false,
      error: { code: "invalid_input", message: "unknown field 'workflow_session_id' not allowed" },
    });
    // A valid input reaches the run core, which checks the scopes (alice has only project:read).
    expect(await start(valid)).toMatchObject({ ok: false, error: { code: "forbidden" } });
  });
});
