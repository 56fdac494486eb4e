/**
 * A real `webcodex-runner run` child against a given Server URL, with the fake
 * agent (ledger per Runner) on one project, in its own temp dir.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FAKE_AGENT_BIN, RUNNER_BIN } from "../../../../packages/server/test/support/proc-stack.js";
import { processesMentioning } from "../../../../packages/server/test/support/stack.js";

export interface RunnerProcOptions {
  url: string;
  token: string;
  maxConcurrentRuns?: number;
  /** Extra `[acp]` lines (e.g. setup_timeout_secs). */
  acp?: Record<string, number>;
  /** Extra env for the Runner (and, through env_from_env, for the agent). */
  env?: Record<string, string>;
  /** CHILD = SOURCE env mappings for the agent besides PATH. */
  envFromEnv?: Record<string, string>;
  /** More fake-agent entries besides `fake`: id and extra CLI flags (start-up faults). */
  agents?: Array<{ id: string; args: string[] }>;
}

export class RunnerProc {
  readonly dir = mkdtempSync(join(tmpdir(), "wc-hardening-runner-"));
  readonly ledger = join(this.dir, "ledger.jsonl");
  readonly configFile = join(this.dir, "runner.toml");
  child: ChildProcess | undefined;
  output = "";

  constructor(readonly opts: RunnerProcOptions) {
    mkdirSync(join(this.dir, "project"), { recursive: true });
    const acp = {
      max_concurrent_runs: opts.maxConcurrentRuns ?? 4,
      setup_timeout_secs: 20,
      permission_timeout_secs: 60,
      cancel_grace_secs: 5,
      ...opts.acp,
    };
    const envLines = Object.entries({ PATH: "PATH", ...opts.envFromEnv })
      .map(([k, v]) => `${k} = ${JSON.stringify(v)}`)
      .join("\n");
    const agent = (id: string, args: string[]) =>
      `\n\n[[acp.agents]]\nid = ${JSON.stringify(id)}\nname = "Fake agent"\nexecutable = ${JSON.stringify(FAKE_AGENT_BIN)}\n` +
      `args = ${JSON.stringify(["--ledger", this.ledger, ...args])}\nallowed_config_options = ["model"]\n` +
      `[acp.agents.env_from_env]\n${envLines}\n`;
    writeFileSync(
      this.configFile,
      `[runner]\nstate_dir = "state"\nlog_level = "info"\n\n` +
        `[server]\nurl = ${JSON.stringify(opts.url)}\ntoken_env = "WEBCODEX_RUNNER_TOKEN"\n\n` +
        `[[projects]]\nid = "p1"\nroot = "project"\nallow_patch = true\n\n[acp]\nagents_share_runner_user = true\n` +
        Object.entries(acp)
          .map(([k, v]) => `${k} = ${v}`)
          .join("\n") +
        agent("fake", []) +
        (opts.agents ?? []).map((a) => agent(a.id, a.args)).join(""),
    );
  }

  start(): ChildProcess {
    const child = spawn(process.execPath, [RUNNER_BIN, "run", "--config", this.configFile], {
      cwd: this.dir,
      env: { ...process.env, ...this.opts.env, WEBCODEX_RUNNER_TOKEN: this.opts.token },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const append = (c: Buffer) => {
      this.output = (this.output + c.toString("utf8")).slice(-256 * 1024);
    };
    child.stdout?.on("data", append);
    child.stderr?.on("data", append);
    this.child = child;
    return child;
  }

  get alive(): boolean {
    return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  prompts(): Array<Record<string, unknown>> {
    if (!existsSync(this.ledger)) return [];
    return readFileSync(this.ledger, "utf8")
      .split("\n")
      .filter((l) => l.trim() !== "")
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .filter((e) => e.event === "prompt");
  }

  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
    const child = this.child;
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill(signal);
      const t = setTimeout(() => child.kill("SIGKILL"), 15_000);
      await exited;
      clearTimeout(t);
    }
  }

  /** Stops the Runner, kills anything still mentioning its dir, removes the dir; returns the survivors. */
  async dispose(): Promise<number[]> {
    await this.stop();
    const survivors = processesMentioning(this.dir);
    for (const pid of survivors) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {}
    }
    rmSync(this.dir, { recursive: true, force: true });
    return survivors;
  }
}
