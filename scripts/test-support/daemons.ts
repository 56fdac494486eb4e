/**
 * A daemon (`webcodex-runner run`, `webcodex-server run`) as a child process
 * of the test: started from dist/ with exactly the environment the test gives,
 * its output held for assertions and failure messages, stopped with a signal
 * and a SIGKILL after a grace the caller names.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { RUNNER_BIN, SERVER_BIN } from "./paths.js";

export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export interface DaemonOptions {
  /** The child's whole environment: spread `process.env` into it to inherit the test's. */
  env: NodeJS.ProcessEnv;
  /** Arguments after `run --config FILE`. */
  args?: readonly string[];
  /** Working directory (relative paths in the config resolve against the config file either way). */
  cwd?: string;
  /** Which output `output()` holds: stdout and stderr interleaved (default) or stderr alone. */
  capture?: "both" | "stderr";
  /** Hold only the last this many characters of output (default: all of it). */
  outputLimit?: number;
  /** Called with every captured chunk, in order, after `output()` includes it (to mirror it elsewhere). */
  onOutput?: (chunk: string) => void;
  /** How long `stop()` waits after its signal before it sends SIGKILL. */
  stopGraceMs: number;
}

export class DaemonProcess {
  readonly child: ChildProcess;
  /** Resolves once the child has exited, with how. */
  readonly exited: Promise<Exit>;
  readonly #stopGraceMs: number;
  #output = "";

  constructor(bin: string, config: string, options: DaemonOptions) {
    const child = spawn(process.execPath, [bin, "run", "--config", config, ...(options.args ?? [])], {
      cwd: options.cwd,
      env: options.env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    this.child = child;
    this.#stopGraceMs = options.stopGraceMs;
    this.exited = new Promise((resolveExit) => child.once("exit", (code, signal) => resolveExit({ code, signal })));
    const hold = (data: Buffer) => {
      const chunk = data.toString("utf8");
      const text = this.#output + chunk;
      this.#output = options.outputLimit === undefined ? text : text.slice(-options.outputLimit);
      options.onOutput?.(chunk);
    };
    child.stderr?.on("data", hold);
    if (options.capture === "stderr") child.stdout?.resume();
    else child.stdout?.on("data", hold);
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  get exitCode(): number | null {
    return this.child.exitCode;
  }

  get signalCode(): NodeJS.Signals | null {
    return this.child.signalCode;
  }

  /** Whether the child has not exited yet. */
  get running(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  /** The output held so far (see DaemonOptions.capture and outputLimit). */
  output(): string {
    return this.#output;
  }

  /** Sends `signal` (if still running) and resolves once the child has exited, however long that takes. */
  async signal(signal: NodeJS.Signals): Promise<Exit> {
    if (this.running) this.child.kill(signal);
    return this.exited;
  }

  /** Sends `signal` (if still running), then SIGKILL if it still runs after `stopGraceMs`; resolves on exit. */
  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<Exit> {
    if (!this.running) return this.exited;
    this.child.kill(signal);
    const timer = setTimeout(() => this.child.kill("SIGKILL"), this.#stopGraceMs);
    try {
      return await this.exited;
    } finally {
      clearTimeout(timer);
    }
  }
}

/** `webcodex-runner run --config <config> [...args]`. */
export function startRunnerProcess(config: string, options: DaemonOptions): DaemonProcess {
  return new DaemonProcess(RUNNER_BIN, config, options);
}

/** `webcodex-server run --config <config> [...args]`. */
export function startServerProcess(config: string, options: DaemonOptions): DaemonProcess {
  return new DaemonProcess(SERVER_BIN, config, options);
}
