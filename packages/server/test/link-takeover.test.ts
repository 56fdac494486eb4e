/**
 * Issue 19 §2 with real processes: a live Runner link is never silently replaced (DESIGN §5). A second
 * `webcodex-runner` holding the real Runner's token is refused and audited while the real one keeps
 * receiving runs; a dropped socket resumes at once with the resume secret; a kill -9'd Runner's
 * replacement gets in within the heartbeat timeout; `runner-token rotate` locks the old token out.
 */
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { connect, createServer, type Server, type Socket } from "node:net";
import { join } from "node:path";
import { promisify } from "node:util";
import { isTerminalState } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import WebSocket from "ws";
import type { StartInput } from "../src/runs-api.js";
import { okValue, ProcStack, RUNNER_BIN, SERVER_BIN, waitFor } from "./support/proc-stack.js";

/** ProcStack's Server heartbeat interval; the link lease runs two of them. */
const HEARTBEAT_MS = 2000;

function input(key: string, prompt = "scenario: hello"): StartInput {
  return { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt };
}

async function runToEnd(s: ProcStack, key: string, prompt?: string): Promise<string> {
  const started = okValue(await s.start("alice", input(key, prompt)));
  await waitFor(
    `run ${key} terminal`,
    async () => {
      const o = okValue(await s.observe("alice", { run_id: started.run_id, wait_secs: 2 }));
      return isTerminalState(o.state) ? o : undefined;
    },
    30_000,
  );
  return started.run_id;
}

function auditEvents(s: ProcStack): string[] {
  const db = s.inproc?.store.db;
  if (!db) throw new Error("in-process server expected");
  return db.prepare("SELECT event FROM runner_link_audit ORDER BY id").pluck().all() as string[];
}

/** Refused hellos audited (one row per runner and window carries their count). */
function refusedCount(s: ProcStack): number {
  const db = s.inproc?.store.db;
  if (!db) throw new Error("in-process server expected");
  return (
    (db.prepare("SELECT SUM(count) FROM runner_link_audit WHERE event = 'link_refused_in_use'").pluck().get() as
      | number
      | null) ?? 0
  );
}

/** A TCP relay between the Runner and the Server whose connections the test can cut. */
class Relay {
  readonly #server: Server;
  readonly pairs: { runner: Socket; server: Socket }[] = [];
  port = 0;

  constructor(target: number) {
    this.#server = createServer((runner) => {
      const server = connect(target, "127.0.0.1");
      this.pairs.push({ runner, server });
      runner.pipe(server);
      server.pipe(runner);
      runner.on("error", () => {});
      server.on("error", () => {});
    });
  }

  async listen(): Promise<this> {
    await new Promise<void>((r) => this.#server.listen(0, "127.0.0.1", () => r()));
    this.port = (this.#server.address() as { port: number }).port;
    return this;
  }

  /**
   * A network blip seen by the Runner only: its side of every relayed connection is cut, the Server's
   * side stays open and silent, so the Server still holds the old link as alive.
   */
  cutRunnerSide(): void {
    for (const p of this.pairs.splice(0)) {
      p.server.unpipe();
      p.runner.unpipe();
      p.runner.destroy();
    }
  }

  close(): Promise<void> {
    for (const p of this.pairs.splice(0)) {
      p.runner.destroy();
      p.server.destroy();
    }
    return new Promise((r) => this.#server.close(() => r()));
  }
}

describe("a live Runner link is never silently replaced (real processes)", () => {
  let s: ProcStack | undefined;
  const extra: ChildProcess[] = [];
  let relay: Relay | undefined;
  afterEach(async () => {
    for (const c of extra.splice(0)) {
      c.kill("SIGKILL");
      if (c.exitCode === null && c.signalCode === null) await new Promise((r) => c.once("exit", r));
    }
    await relay?.close();
    relay = undefined;
    await s?.stop();
    s = undefined;
  });

  it("refuses and audits an impostor holding the Runner's token while the real Runner keeps receiving the runs", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    await s.startRunner("r1");
    // The impostor: a second Runner with the stolen token, its own store and its own agent ledger.
    const impostorLedger = join(s.dir, "ledger-impostor.jsonl");
    const impostorConfig = join(s.dir, "runner-impostor.toml");
    writeFileSync(
      impostorConfig,
      readFileSync(join(s.dir, "runner-r1.toml"), "utf8")
        .replace('state_dir = "runner-state-r1"', 'state_dir = "runner-state-impostor"')
        .replace(s.ledgerFile("r1"), impostorLedger),
    );
    let impostorLog = "";
    const impostor = spawn(process.execPath, [RUNNER_BIN, "run", "--config", impostorConfig], {
      cwd: s.dir,
      env: { ...process.env, WEBCODEX_RUNNER_TOKEN: s.tokens.get("r1") ?? "" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    extra.push(impostor);
    const append = (c: Buffer) => {
      impostorLog += c.toString("utf8");
    };
    impostor.stdout?.on("data", append);
    impostor.stderr?.on("data", append);
    await waitFor("two refused impostor hellos", () => refusedCount(s!) >= 2);

    for (const key of ["a", "b", "c"]) await runToEnd(s, `impostor-${key}`);
    expect(s.prompts("r1")).toHaveLength(3);
    const impostorPrompts = (() => {
      try {
        return readFileSync(impostorLedger, "utf8")
          .split("\n")
          .filter((l) => l.includes('"prompt"'));
      } catch {
        return [];
      }
    })();
    expect(impostorPrompts).toEqual([]);
    expect(auditEvents(s)[0]).toBe("link_granted");
    expect(auditEvents(s)).not.toContain("link_resumed");
    expect(impostorLog).toContain("link_in_use");
  });

  it("resumes at once after a network blip the Server did not see, with the resume secret", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    relay = await new Relay(s.port).listen();
    const cfg = join(s.dir, "runner-r1.toml");
    writeFileSync(cfg, readFileSync(cfg, "utf8").replace(`127.0.0.1:${s.port}/`, `127.0.0.1:${relay.port}/`));
    await s.startRunner("r1");
    const started = okValue(await s.start("alice", input("blip", "scenario: slow interval_ms=100 count=40")));
    await waitFor("the run to be running", async () => {
      const o = okValue(await s!.observe("alice", { run_id: started.run_id }));
      return o.events.length > 0;
    });
    const cut = Date.now();
    relay.cutRunnerSide();
    await waitFor("the link resumed", () => auditEvents(s!).includes("link_resumed"), 3 * HEARTBEAT_MS);
    // Resumed before the Server could have declared the old link dead: the secret did it, not a timeout.
    expect(Date.now() - cut).toBeLessThan(2 * HEARTBEAT_MS);
    expect(auditEvents(s)).not.toContain("link_refused_in_use");
    const o = await waitFor(
      "the run to finish",
      async () => {
        const v = okValue(await s!.observe("alice", { run_id: started.run_id, wait_secs: 2 }));
        return isTerminalState(v.state) ? v : undefined;
      },
      30_000,
    );
    expect(o.state).toBe("completed");
    expect(s.prompts("r1")).toHaveLength(1);
  });

  it("lets a kill -9'd Runner's replacement in once the old link is declared dead, within the heartbeat timeout", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    await s.startRunner("r1");
    await s.killRunner("r1", "SIGKILL");
    const killed = Date.now();
    await s.startRunner("r1");
    // The lease (2 heartbeats) plus the replacement's bounded retry pace.
    expect(Date.now() - killed).toBeLessThan(2 * HEARTBEAT_MS + 5000);
    const events = auditEvents(s);
    expect(events.filter((e) => e === "link_granted")).toHaveLength(2);
    expect(events.at(-1)).toBe("link_granted");
    await runToEnd(s, "after-replacement");
    expect(s.prompts("r1")).toHaveLength(1);
  });

  it("rotate replaces the Runner's token: the live link closes, the old token is refused, the new one works", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    await s.startRunner("r1");
    const oldToken = s.tokens.get("r1") ?? "";
    const { stdout, stderr } = await promisify(execFile)(
      process.execPath,
      [SERVER_BIN, "runner-token", "rotate", "--runner", "r1", "--config", s.serverConfigFile],
      { cwd: s.dir },
    );
    const newToken = stdout.trim();
    expect(newToken).toMatch(/^wcr_[A-Za-z0-9_-]{43}$/);
    expect(stderr).toContain("old token no longer authenticates");
    await s.waitOffline("r1");
    expect(auditEvents(s)).toContain("closed_token_rotated");
    await waitFor("the Runner to log the rotation", () => s?.logs.get("r1")?.includes("token_revoked"));

    const status = await new Promise<number | null>((resolve) => {
      const ws = new WebSocket(`ws://127.0.0.1:${s?.port}/runner`, {
        headers: { authorization: `Bearer ${oldToken}` },
      });
      ws.on("unexpected-response", (_req, res) => resolve(res.statusCode ?? null));
      ws.on("open", () => {
        ws.terminate();
        resolve(null);
      });
      ws.on("error", () => {});
    });
    expect(status).toBe(401);

    await s.killRunner("r1", "SIGTERM");
    s.tokens.set("r1", newToken);
    await s.startRunner("r1");
    await runToEnd(s, "after-rotate");
    expect(s.prompts("r1")).toHaveLength(1);
  });
});
