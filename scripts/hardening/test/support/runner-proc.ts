/**
 * A real `webcodex-runner run` child against a given Server URL, with the fake
 * agent (ledger per Runner) on one project, in its own temp dir.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  type DaemonProcess,
  FAKE_AGENT_BIN,
  killProcesses,
  type LedgerLine,
  ledgerPrompts,
  processesMentioning,
  startRunnerProcess,
} from "../../../test-support/index.js";

/** The tail of the Runner's output that `output` holds, across restarts. */
const OUTPUT_CHARS = 256 * 1024;
/** How long stop() gives the Runner after its signal before SIGKILL. */
const STOP_GRACE_MS = 15_000;

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
  child: DaemonProcess | undefined;
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

  start(): DaemonProcess {
    this.child = startRunnerProcess(this.configFile, {
      cwd: this.dir,
      env: { ...process.env, ...this.opts.env, WEBCODEX_RUNNER_TOKEN: this.opts.token },
      stopGraceMs: STOP_GRACE_MS,
      onOutput: (chunk) => {
        this.output = (this.output + chunk).slice(-OUTPUT_CHARS);
      },
    });
    return this.child;
  }

  get alive(): boolean {
    return this.child?.running === true;
  }

  prompts(): LedgerLine[] {
    return ledgerPrompts(this.ledger);
  }

  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
    await this.child?.stop(signal);
  }

  /** Stops the Runner, kills anything still mentioning its dir, removes the dir; returns the survivors. */
  async dispose(): Promise<number[]> {
    await this.stop();
    const survivors = processesMentioning(this.dir);
    killProcesses(survivors);
    rmSync(this.dir, { recursive: true, force: true });
    return survivors;
  }
}
