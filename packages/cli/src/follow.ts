/**
 * Follows one run with observe_coding_agent until it is terminal: each call
 * passes the previous observation token and one bounded wait, so the Server
 * answers as soon as anything new exists. A lost connection (the Server
 * restarting) is retried for a bounded time; everything else ends the loop.
 */
import { CliError } from "./errors.js";
import type { RunsClient } from "./server-client.js";
import { isTerminal, type Observation } from "./wire.js";

/** observe_coding_agent caps wait_secs at 30; stay below so proxies do not time out first. */
export const FOLLOW_WAIT_SECS = 25;

export interface FollowOptions {
  client: Pick<RunsClient, "observe" | "reset">;
  runId: string;
  /** Observation token to continue from; absent → the Server's baseline. */
  token?: string | undefined;
  onObservation(obs: Observation): void;
  /** Told before each reconnect attempt. */
  onRetry?(error: CliError, attempt: number): void;
  /** Aborting stops following (the run itself goes on). */
  signal?: AbortSignal | undefined;
  waitSecs?: number;
  /** How long a lost connection is retried before giving up. */
  retryForMs?: number;
  sleep?(ms: number, signal?: AbortSignal): Promise<void>;
}

/** Resolves with the terminal observation; rejects with CliError. */
export async function followRun(options: FollowOptions): Promise<Observation> {
  const sleep = options.sleep ?? defaultSleep;
  const waitSecs = options.waitSecs ?? FOLLOW_WAIT_SECS;
  const retryForMs = options.retryForMs ?? 60_000;
  let token = options.token;
  let hasMore = false;
  let failingSince: number | undefined;
  let attempt = 0;
  for (;;) {
    if (isAborted(options.signal)) throw new CliError("interrupted", "stopped following");
    let obs: Observation;
    try {
      obs = await options.client.observe(
        {
          run_id: options.runId,
          ...(token !== undefined ? { after_observation_token: token } : {}),
          wait_secs: hasMore ? 0 : waitSecs,
        },
        options.signal,
      );
    } catch (err) {
      if (isAborted(options.signal)) throw new CliError("interrupted", "stopped following", { cause: err });
      if (!(err instanceof CliError) || !err.transient) throw err;
      failingSince ??= Date.now();
      if (Date.now() - failingSince > retryForMs) throw err;
      attempt++;
      options.onRetry?.(err, attempt);
      await options.client.reset();
      await sleep(Math.min(500 * 2 ** (attempt - 1), 5000), options.signal);
      continue;
    }
    failingSince = undefined;
    attempt = 0;
    options.onObservation(obs);
    token = obs.observation_token;
    hasMore = obs.has_more;
    if (isTerminal(obs.state) && !obs.has_more) return obs;
  }
}

function isAborted(signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true;
}

function defaultSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}
