/**
 * The Server's one teardown list. Every service registers its close as it is built (`add`); `run()` closes them
 * last-built-first, so what the others stand on — the state DB and its lock, opened first — closes last, and
 * what was built last — the listeners — stops first. The order that gives (design §2, "Shutdown"): stop
 * accepting → stop work → close the stores. Each step is bounded (`TEARDOWN_STEP_TIMEOUT_MS`); a step that throws
 * or does not finish in time is logged by name and the rest still run.
 */
import type { Logger } from "pino";

/** How long one teardown step may take before the next one runs anyway. */
export const TEARDOWN_STEP_TIMEOUT_MS = 10_000;

/**
 * How long `webcodex-server run` may take from SIGINT/SIGTERM to its exit: the teardown (each step bounded above)
 * and then the event loop's last handles. A handle some step left open would keep the process alive for ever;
 * past this deadline it exits 1, and the log names the kinds of handles still open (never their contents).
 */
export const SHUTDOWN_DEADLINE_MS = 30_000;
/** Test-only (test/wiring/shutdown-deadline.test.ts): a shorter deadline, in ms. */
export const SHUTDOWN_DEADLINE_TEST_ENV = "WEBCODEX_TEST_HOOK_SHUTDOWN_DEADLINE_MS";
/** Test-only: `run` leaves one interval timer running at shutdown, as a leaking step would (main.ts). */
export const SHUTDOWN_LEAK_TEST_ENV = "WEBCODEX_TEST_HOOK_LEAK_AT_SHUTDOWN";

/**
 * Arm the shutdown deadline (an unref'd timer: it never keeps the process alive itself). The process exits on its
 * own once the event loop is empty; if it is not by `deadlineMs`, this logs what is still open and exits 1.
 */
export function armShutdownDeadline(logger: Logger, env: NodeJS.ProcessEnv = process.env): void {
  const fromEnv = Number(env[SHUTDOWN_DEADLINE_TEST_ENV]);
  const deadlineMs = Number.isInteger(fromEnv) && fromEnv > 0 ? fromEnv : SHUTDOWN_DEADLINE_MS;
  setTimeout(() => {
    logger.error(
      { deadline_ms: deadlineMs, open: process.getActiveResourcesInfo() },
      "shutdown did not end in time: exiting with what is still open",
    );
    process.exit(1);
  }, deadlineMs).unref();
}

export type CloseStep = () => void | Promise<void>;

export interface TeardownOptions {
  logger: Logger;
  /** Defaults to TEARDOWN_STEP_TIMEOUT_MS. */
  stepTimeoutMs?: number;
}

export class Teardown {
  readonly #steps: { name: string; close: CloseStep }[] = [];
  readonly #logger: Logger;
  readonly #stepTimeoutMs: number;
  #running: Promise<void> | null = null;

  constructor(opts: TeardownOptions) {
    this.#logger = opts.logger;
    this.#stepTimeoutMs = opts.stepTimeoutMs ?? TEARDOWN_STEP_TIMEOUT_MS;
  }

  /** Register `close` for what was just built; it runs before everything registered earlier. */
  add(name: string, close: CloseStep): void {
    if (this.#running) throw new Error(`teardown is running: "${name}" was built after the shutdown began`);
    this.#steps.push({ name, close });
  }

  /** The registered steps' names, in the order `run()` takes them. */
  get order(): string[] {
    return this.#steps.map((s) => s.name).reverse();
  }

  /** Run every step, last registered first; the same promise on every call. Never rejects. */
  run(): Promise<void> {
    this.#running ??= (async () => {
      for (let step = this.#steps.pop(); step !== undefined; step = this.#steps.pop()) await this.#runStep(step);
    })();
    return this.#running;
  }

  async #runStep(step: { name: string; close: CloseStep }): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((resolve) => {
      timer = setTimeout(() => resolve("late"), this.#stepTimeoutMs);
    });
    try {
      const done = Promise.resolve()
        .then(step.close)
        .then(() => "done" as const);
      if ((await Promise.race([done, late])) === "late") {
        this.#logger.warn(
          { step: step.name, timeout_ms: this.#stepTimeoutMs },
          "shutdown step did not finish in time; the next steps run anyway",
        );
        // It may still fail later: logged, never unhandled.
        done.catch((err: unknown) => this.#failed(step.name, err));
      }
    } catch (err) {
      this.#failed(step.name, err);
    } finally {
      clearTimeout(timer);
    }
  }

  #failed(name: string, err: unknown): void {
    this.#logger.error(
      { step: name, err: err instanceof Error ? err.message : String(err) },
      "shutdown step failed; the next steps run anyway",
    );
  }
}
