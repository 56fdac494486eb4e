/**
 * Issue 19 §2, the restart gap: link leases are written down in the state DB, so a Server restart
 * (kill -9 or SIGTERM) does not hand the link to the first hello carrying the token. An impostor with
 * the real Runner's token that connects right after the restart — before the real Runner can — is
 * refused (`link_in_use`) and audited; the real Runner resumes with the secret it kept in memory and
 * keeps receiving the runs. Real Server child process, real Runners, real SQLite file.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { connect, createServer, type Server, type Socket } from "node:net";
import { join } from "node:path";
import { isTerminalState } from "@webcodex/protocol";
import Database from "better-sqlite3";
import { afterEach, describe, expect, it } from "vitest";
import { okValue, ProcStack, RUNNER_BIN, waitFor } from "./support/proc-stack.js";

/** Long enough that the lease (two intervals) cannot run out while the Server restarts on a slow machine. */
const HEARTBEAT_MS = 30_000;

/** A TCP relay in front of the Server that holds new connections back while gated. */
class GatedRelay {
  readonly #server: Server;
  readonly #open: Socket[] = [];
  readonly #held: Socket[] = [];
  gated = false;
  port = 0;

  constructor(readonly target: number) {
    this.#server = createServer((runner) => {
      runner.on("error", () => {});
      if (this.gated) {
        runner.pause();
        this.#held.push(runner);
      } else this.#forward(runner);
    });
  }

  #forward(runner: Socket): void {
    const server = connect(this.target, "127.0.0.1");
    server.on("error", () => runner.destroy());
    runner.on("close", () => server.destroy());
    server.on("close", () => runner.destroy());
    runner.pipe(server);
    server.pipe(runner);
    this.#open.push(runner, server);
  }

  async listen(): Promise<this> {
    await new Promise<void>((r) => this.#server.listen(0, "127.0.0.1", () => r()));
    this.port = (this.#server.address() as { port: number }).port;
    return this;
  }

  /** Let the held connections (those the Runner has not given up on) and every later one through. */
  release(): void {
    this.gated = false;
    for (const s of this.#held.splice(0)) if (!s.destroyed) this.#forward(s);
  }

  close(): Promise<void> {
    for (const s of [...this.#open.splice(0), ...this.#held.splice(0)]) s.destroy();
    return new Promise((r) => this.#server.close(() => r()));
  }
}

function linkAudit(s: ProcStack): { event: string; count: number }[] {
  const db = new Database(join(s.serverStateDir, "server.sqlite3"), { readonly: true, fileMustExist: true });
  try {
    return db.prepare("SELECT event, count FROM runner_link_audit ORDER BY id").all() as {
      event: string;
      count: number;
    }[];
  } finally {
    db.close();
  }
}

async function runToEnd(s: ProcStack, key: string): Promise<void> {
  const started = okValue(
    await s.start("alice", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: key,
      prompt: "scenario: hello",
    }),
  );
  const o = await waitFor(
    `run ${key} terminal`,
    async () => {
      const v = okValue(await s.observe("alice", { run_id: started.run_id, wait_secs: 2 }));
      return isTerminalState(v.state) ? v : undefined;
    },
    30_000,
  );
  expect(o.state).toBe("completed");
}

describe("link leases survive a Server restart (real processes)", () => {
  let s: ProcStack | undefined;
  let relay: GatedRelay | undefined;
  const extra: ChildProcess[] = [];
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

  for (const signal of ["SIGKILL", "SIGTERM"] as const) {
    it(`after a ${signal} Server restart an impostor with the token is refused and audited; the real Runner resumes and keeps receiving runs`, async () => {
      s = await new ProcStack({
        runners: [{ id: "r1", projects: ["demo"] }],
        server: "child",
        heartbeatIntervalMs: HEARTBEAT_MS,
      }).init();
      // The impostor talks to the Server directly; the real Runner goes through a relay the test can gate.
      const cfg = join(s.dir, "runner-r1.toml");
      const original = readFileSync(cfg, "utf8");
      const impostorLedger = join(s.dir, "ledger-impostor.jsonl");
      const impostorConfig = join(s.dir, "runner-impostor.toml");
      writeFileSync(
        impostorConfig,
        original
          .replace('state_dir = "runner-state-r1"', 'state_dir = "runner-state-impostor"')
          .replace(s.ledgerFile("r1"), impostorLedger),
      );
      relay = await new GatedRelay(s.port).listen();
      writeFileSync(cfg, original.replace(`127.0.0.1:${s.port}/`, `127.0.0.1:${relay.port}/`));
      await s.startRunner("r1");
      await runToEnd(s, "before-restart");

      // The real Runner cannot reach the restarted Server until the impostor has tried.
      relay.gated = true;
      await s.killServer(signal);
      await s.startServer();
      let impostorLog = "";
      const impostor = spawn(process.execPath, [RUNNER_BIN, "run", "--config", impostorConfig], {
        cwd: s.dir,
        env: { ...process.env, WEBCODEX_RUNNER_TOKEN: s.tokens.get("r1") ?? "" },
        stdio: ["ignore", "pipe", "pipe"],
      });
      extra.push(impostor);
      impostor.stdout?.on("data", (c: Buffer) => {
        impostorLog += c.toString("utf8");
      });
      impostor.stderr?.on("data", (c: Buffer) => {
        impostorLog += c.toString("utf8");
      });
      await waitFor("the impostor refused after the restart", () =>
        linkAudit(s!).some((r) => r.event === "link_refused_in_use"),
      );
      expect(linkAudit(s).map((r) => r.event)).toEqual(["link_granted", "link_refused_in_use"]);
      await waitFor("the impostor to hear link_in_use", () => impostorLog.includes("link_in_use"));

      relay.release();
      await waitFor("the real Runner to resume", () => linkAudit(s!).some((r) => r.event === "link_resumed"));
      for (const key of ["after-1", "after-2"]) await runToEnd(s, key);
      expect(s.prompts("r1")).toHaveLength(3);
      let impostorPrompts = 0;
      try {
        impostorPrompts = readFileSync(impostorLedger, "utf8")
          .split("\n")
          .filter((l) => l.includes('"prompt"')).length;
      } catch {
        // no ledger: the impostor's agent never ran
      }
      expect(impostorPrompts).toBe(0);
      expect(linkAudit(s).filter((r) => r.event === "link_granted")).toHaveLength(1);
    });
  }
});
