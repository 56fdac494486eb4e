/**
 * Issue 12 §2: the Runner link is authenticated both ways. The Server terminates TLS itself with
 * `[server.tls]` (a private CA made in the test with openssl), a Runner trusts it through
 * `[server] ca_file` and fails closed without it; plain ws:// to a non-loopback host and a
 * non-loopback Server without TLS are refused at start with a precise message unless the
 * operator sets the loudly named override, which then warns.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { get } from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll, startRunnerProcess } from "../../../scripts/test-support/index.js";
import { buildServerConfig, sha256Hex } from "../src/config.js";
import { startServer } from "../src/server.js";
import { captureLogger } from "./support/in-process.js";
import { ProcStack } from "./support/proc-stack.js";
import { makeTestCa, type TestCa } from "./support/test-ca.js";

/** How long a Runner this file stops gets after its signal before SIGKILL. */
const RUNNER_STOP_GRACE_MS = 10_000;

async function runnerExit(
  config: string,
  env: Record<string, string> = {},
): Promise<{ code: number | null; out: string }> {
  const runner = startRunnerProcess(config, { env: { ...process.env, ...env }, stopGraceMs: RUNNER_STOP_GRACE_MS });
  const { code } = await runner.exited;
  return { code, out: runner.output() };
}

describe("TLS on the Runner link and the Server", () => {
  let s: ProcStack | undefined;
  const dirs: string[] = [];
  afterEach(async () => {
    await s?.stop();
    s = undefined;
    for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
  });

  function caDir(): TestCa {
    const dir = mkdtempSync(join(tmpdir(), "wc-ca-"));
    dirs.push(dir);
    return makeTestCa(dir);
  }

  it("serves https:// and wss:// with [server.tls]; a Runner trusting the private CA through ca_file runs a prompt", async () => {
    const ca = caDir();
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }], tls: ca }).init();
    expect(s.inproc?.url).toMatch(/^https:\/\/127\.0\.0\.1:/);
    const health = await new Promise<number | undefined>((resolve, reject) => {
      get(`https://127.0.0.1:${s?.port}/healthz`, { ca: readFileSync(ca.caFile) }, (res) => {
        res.resume();
        resolve(res.statusCode);
      }).on("error", reject);
    });
    expect(health).toBe(200);
    expect(readFileSync(join(s.dir, "runner-r1.toml"), "utf8")).toContain(`url = "wss://127.0.0.1:${s.port}/runner"`);

    await s.startRunner("r1");
    expect((await s.runToEnd("tls")).state).toBe("completed");
    expect(s.prompts("r1")).toHaveLength(1);
  });

  it("fails closed without ca_file: the Runner refuses the private CA's certificate and never comes online", async () => {
    const ca = caDir();
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }], tls: ca }).init();
    const cfg = join(s.dir, "runner-r1.toml");
    writeFileSync(cfg, readFileSync(cfg, "utf8").replace(/^ca_file = .*\n/m, ""));
    const child = startRunnerProcess(cfg, {
      cwd: s.dir,
      env: { ...process.env, WEBCODEX_RUNNER_TOKEN: s.tokens.get("r1") ?? "" },
      stopGraceMs: RUNNER_STOP_GRACE_MS,
    });
    try {
      await poll(() => (child.output().match(/TLS certificate is not trusted/g) ?? []).length >= 2, {
        timeoutMs: DAEMON_WAIT_MS,
        intervalMs: DAEMON_POLL_MS,
        what: "two refused TLS handshakes",
      });
      expect(child.output()).toMatch(/SELF_SIGNED|UNABLE_TO_VERIFY/);
      expect((await s.projects("alice")).every((p) => !p.runner_online)).toBe(true);
      expect(await s.inproc?.store.engine.all("SELECT id FROM runner_link_audit")).toEqual([]);
    } finally {
      await child.signal("SIGKILL");
    }
  });

  it("refuses a ws:// Server URL on a non-loopback host at start, naming the key and the fix", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    const cfg = join(s.dir, "runner-r1.toml");
    writeFileSync(
      cfg,
      readFileSync(cfg, "utf8").replace(`ws://127.0.0.1:${s.port}/`, "ws://runner-link.example:7420/"),
    );
    const { code, out } = await runnerExit(cfg, { WEBCODEX_RUNNER_TOKEN: s.tokens.get("r1") ?? "" });
    expect(code).not.toBe(0);
    expect(out).toContain(`${cfg}: server.url: ws:// to the non-loopback host "runner-link.example"`);
    expect(out).toContain("use wss://");
    expect(out).toContain("allow_insecure_transport = true");
  });

  it("with allow_insecure_transport = true connects over plain ws:// to a non-loopback host and warns at every connect", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    const cfg = join(s.dir, "runner-r1.toml");
    // 0.0.0.0 reaches this machine's listeners but is not a loopback name: the override is needed.
    writeFileSync(
      cfg,
      readFileSync(cfg, "utf8").replace(
        `url = "ws://127.0.0.1:${s.port}/runner"`,
        `url = "ws://0.0.0.0:${s.port}/runner"\nallow_insecure_transport = true`,
      ),
    );
    await s.startRunner("r1");
    await s.killServer("SIGTERM");
    await s.startServer(); // the Runner reconnects: a second connect, a second warning
    await poll(async () => (await s?.projects("alice"))?.[0]?.runner_online, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the Runner back online",
    });
    await poll(() => (s?.logs.get("r1")?.match(/INSECURE: connecting with ws:\/\//g) ?? []).length >= 2, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "a warning per connect",
    });
  });

  it("refuses to listen on a non-loopback host without TLS unless allow_insecure_http = true, which warns", async () => {
    const dir = mkdtempSync(join(tmpdir(), "wc-insecure-"));
    dirs.push(dir);
    const doc = (extra: Record<string, unknown>) => ({
      server: { host: "0.0.0.0", port: 0, state_dir: "state", ...extra },
      runners: [{ id: "r1", token_sha256: sha256Hex("t".repeat(32)), projects: ["demo"] }],
    });
    const log = captureLogger();
    const refused = startServer({
      config: buildServerConfig(doc({}), { file: "/etc/wc/server.toml", baseDir: dir }),
      logger: log.logger,
      env: {},
    });
    await expect(refused).rejects.toThrow(
      '/etc/wc/server.toml: server.host: "0.0.0.0" is not a loopback address and [server.tls] is not set',
    );
    await expect(refused).rejects.toThrow("allow_insecure_http = true");

    const allowed = await startServer({
      config: buildServerConfig(doc({ allow_insecure_http: true }), { file: null, baseDir: dir }),
      logger: log.logger,
      env: {},
    });
    await allowed.close();
    expect(log.lines.join("")).toContain("INSECURE: listening on a non-loopback address without TLS");
  });

  it("names an unreadable [server.tls] file precisely", async () => {
    const dir = mkdtempSync(join(tmpdir(), "wc-tls-missing-"));
    dirs.push(dir);
    const config = buildServerConfig(
      { server: { port: 0, state_dir: "state", tls: { cert_file: "nope.crt", key_file: "nope.key" } } },
      { file: join(dir, "server.toml"), baseDir: dir },
    );
    await expect(startServer({ config, logger: captureLogger().logger, env: {} })).rejects.toThrow(
      `server.tls.cert_file: cannot read ${join(dir, "nope.crt")} (ENOENT)`,
    );
  });
});
