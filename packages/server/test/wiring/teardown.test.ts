/**
 * The Server's one teardown list (wiring/teardown.ts): last built first, each step bounded, a step that throws or
 * hangs logged and the rest still run; the wiring (wiring/services.ts) closes the stores last; and a real Server
 * with a Runner link open closes every step in time, gives its port and its state back, and starts again on both.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { IN_PROCESS_POLL_MS, IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { buildServerConfig, sha256Hex } from "../../src/config.js";
import { startServer } from "../../src/server.js";
import { lockStateDir } from "../../src/state/lock.js";
import { buildServices } from "../../src/wiring/services.js";
import { Teardown } from "../../src/wiring/teardown.js";
import { FakeRunService } from "../support/fake-run-service.js";
import { alice, captureLogger, Harness } from "../support/in-process.js";
import { testServerState } from "../support/test-state.js";

/** A step bound short enough that the hanging step below is cut off at once. */
const SHORT_STEP_MS = 50;

const R1 = { id: "r1", token: "token-one-aaaaaaaaaaaaaaaa", projects: ["demo"] };

/** The log lines (pino JSON) a teardown wrote about its steps: the step's name and the message. */
function stepLines(lines: string[]): { step: string; msg: string }[] {
  return lines
    .map((l) => JSON.parse(l) as { step?: string; msg: string })
    .flatMap((l) => (l.step === undefined ? [] : [{ step: l.step, msg: l.msg }]));
}

describe("the teardown list", () => {
  it("runs the steps last registered first, each once, however often run() is called", async () => {
    const log = captureLogger();
    const teardown = new Teardown({ logger: log.logger });
    const ran: string[] = [];
    for (const name of ["store", "hub", "mcp", "listener"]) teardown.add(name, () => void ran.push(name));
    expect(teardown.order).toEqual(["listener", "mcp", "hub", "store"]);
    const first = teardown.run();
    expect(teardown.run()).toBe(first);
    await first;
    await teardown.run();
    expect(ran).toEqual(["listener", "mcp", "hub", "store"]);
    expect(stepLines(log.lines)).toEqual([]);
    expect(() => teardown.add("late", () => undefined)).toThrow(/"late" was built after the shutdown began/);
  });

  it("a step that throws, rejects or hangs is logged by name, and every step after it still runs", async () => {
    const log = captureLogger();
    const teardown = new Teardown({ logger: log.logger, stepTimeoutMs: SHORT_STEP_MS });
    const ran: string[] = [];
    teardown.add("store", async () => {
      await Promise.resolve();
      ran.push("store");
    });
    teardown.add("hangs", () => new Promise<void>(() => undefined));
    teardown.add("rejects", async () => {
      ran.push("rejects");
      throw new Error("rejected close");
    });
    teardown.add("throws", () => {
      ran.push("throws");
      throw new Error("thrown close");
    });
    teardown.add("listener", () => void ran.push("listener"));
    await teardown.run();
    expect(ran).toEqual(["listener", "throws", "rejects", "store"]);
    expect(stepLines(log.lines)).toEqual([
      { step: "throws", msg: "shutdown step failed; the next steps run anyway" },
      { step: "rejects", msg: "shutdown step failed; the next steps run anyway" },
      { step: "hangs", msg: "shutdown step did not finish in time; the next steps run anyway" },
    ]);
  });

  it("a step that fails after its bound is logged too, never an unhandled rejection", async () => {
    const log = captureLogger();
    const teardown = new Teardown({ logger: log.logger, stepTimeoutMs: SHORT_STEP_MS });
    let fail: (err: Error) => void = () => undefined;
    teardown.add("late failure", () => new Promise<void>((_resolve, reject) => (fail = reject)));
    await teardown.run();
    fail(new Error("failed after its bound"));
    await poll(() => stepLines(log.lines).length === 2, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: 10 });
    expect(stepLines(log.lines).map((l) => l.msg)).toEqual([
      "shutdown step did not finish in time; the next steps run anyway",
      "shutdown step failed; the next steps run anyway",
    ]);
  });
});

describe("the wiring", () => {
  it("registers every service as it builds it: the MCP front end before the run core, the stores last", async () => {
    const dir = mkdtempSync(join(tmpdir(), "wc-wiring-"));
    const state = await testServerState();
    const log = captureLogger();
    const config = buildServerConfig(
      {
        server: { host: "127.0.0.1", port: 0, state_dir: "state", ...state.server },
        runners: [{ id: R1.id, token_sha256: sha256Hex(R1.token), projects: R1.projects }],
        principals: [{ id: "alice", scopes: ["coding_agent:run", "project:write"], projects: ["demo"] }],
      },
      { file: null, baseDir: dir },
    );
    const teardown = new Teardown({ logger: log.logger });
    try {
      const services = await buildServices(
        { config, logger: log.logger, env: state.env, mcp: true, tls: false },
        teardown,
      );
      const order = teardown.order;
      const at = (name: string) => {
        expect(order).toContain(name);
        return order.indexOf(name);
      };
      // Stop work: the console and the MCP front end (its handler, then what the handler uses), then the run
      // core before the hub whose listener it is, then the timers; what is left on the listeners is dropped;
      // the stores close last.
      expect(at("operator console")).toBeLessThan(at("mcp handler"));
      expect(at("mcp handler")).toBeLessThan(at("agent tasks"));
      expect(at("agent tasks")).toBeLessThan(at("workflow sessions"));
      expect(at("workflow sessions")).toBeLessThan(at("mcp audit log"));
      expect(at("mcp audit log")).toBeLessThan(at("principal tokens"));
      expect(at("principal tokens")).toBeLessThan(at("run core"));
      expect(at("run core")).toBeLessThan(at("runner hub"));
      expect(at("runner hub")).toBeLessThan(at("rejected-record expiry"));
      expect(at("rejected-record expiry")).toBeLessThan(at("connections left open"));
      const stores = services.store.engine.dialect === "sqlite" ? ["state store", "state dir lock"] : ["state store"];
      expect(order.slice(order.indexOf("connections left open") + 1)).toEqual(stores);
      await teardown.run();
      expect(stepLines(log.lines)).toEqual([]);
      if (services.store.engine.dialect === "sqlite") lockStateDir(config.stateDir).release();
    } finally {
      await teardown.run();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("a real Server's close", () => {
  let h: Harness | undefined;
  afterEach(async () => {
    await h?.close();
    h = undefined;
  });

  it("with a Runner link open finishes every step in time, frees its port and its state, and starts again on both", async () => {
    h = await new Harness().start([R1]);
    const harness = h;
    const svc = new FakeRunService();
    const link = harness.link(svc, R1.token);
    const online = async () =>
      (await harness.server.runs.listProjects(alice)).some((p) => p.project_id === "demo" && p.runner_online);
    await poll(online, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    const port = harness.server.port;
    await harness.server.close();
    // Every step finished in time: none was cut off (the listeners' connections are dropped only after the hub
    // closed the Runner's link; dropped earlier, the wait for that upgraded socket would run into its bound).
    expect(stepLines(harness.log.lines)).toEqual([]);
    expect(harness.log.lines.some((l) => l.includes("shutdown step"))).toBe(false);
    // The port is free: a plain listener takes it.
    const probe = createServer();
    await new Promise<void>((resolve, reject) => {
      probe.once("error", reject);
      probe.listen(port, "127.0.0.1", () => resolve());
    });
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    // The state is given back: on SQLite the state dir's lock is free.
    if (harness.config.state.backend === "sqlite") lockStateDir(harness.config.stateDir).release();
    // And a new Server starts on the same port and state, and the Runner links to it again.
    await harness.restartServer();
    expect(harness.server.port).toBe(port);
    await poll(() => link.connected, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    await poll(online, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
  });

  it("that never listened (its port is taken) gives back what the start took, in the same order", async () => {
    const blocker = createServer();
    await new Promise<void>((resolve, reject) => {
      blocker.once("error", reject);
      blocker.listen(0, "127.0.0.1", () => resolve());
    });
    const taken = (blocker.address() as { port: number }).port;
    const dir = mkdtempSync(join(tmpdir(), "wc-teardown-"));
    const state = await testServerState();
    const log = captureLogger();
    try {
      const config = buildServerConfig(
        {
          server: { host: "127.0.0.1", port: taken, state_dir: "state", ...state.server },
          runners: [{ id: R1.id, token_sha256: sha256Hex(R1.token), projects: R1.projects }],
          principals: [{ id: "alice", scopes: ["coding_agent:run", "project:write"], projects: ["demo"] }],
        },
        { file: null, baseDir: dir },
      );
      await expect(startServer({ config, logger: log.logger, env: state.env, mcp: true })).rejects.toThrow(
        /EADDRINUSE/,
      );
      expect(stepLines(log.lines)).toEqual([]);
      // The lock and the state are free: the same start succeeds once the port is.
      if (config.state.backend === "sqlite") lockStateDir(config.stateDir).release();
      await new Promise<void>((resolve) => blocker.close(() => resolve()));
      const server = await startServer({ config, logger: log.logger, env: state.env, mcp: true });
      expect(server.port).toBe(taken);
      await server.close();
    } finally {
      if (blocker.listening) blocker.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
