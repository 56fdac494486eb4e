/** Test helpers: recorded streams, a scripted RunsClient, and in-memory output streams. */
import { readFileSync } from "node:fs";
import type { CliContext } from "../src/context.js";
import type { RunsClient } from "../src/server-client.js";
import { type CancelResult, Observation, type ProjectView, StartResult } from "../src/wire.js";

export interface Recorded {
  start: StartResult;
  observations: Observation[];
}

export function loadRecorded(name: string): Recorded {
  const raw = JSON.parse(readFileSync(new URL(`./fixtures/${name}.json`, import.meta.url), "utf8")) as {
    start: unknown;
    observations: unknown[];
  };
  return { start: StartResult.parse(raw.start), observations: raw.observations.map((o) => Observation.parse(o)) };
}

export class MemoryStream {
  chunks: string[] = [];
  isTTY = false;
  write(chunk: string): boolean {
    this.chunks.push(chunk);
    return true;
  }
  get text(): string {
    return this.chunks.join("");
  }
}

export interface ScriptedClient extends RunsClient {
  calls: { tool: string; args: unknown }[];
}

/**
 * Plays a recorded stream: start returns `start`, each observe returns the
 * next observation (the last one repeats). `beforeObserve(i)` runs before
 * the i-th observe answers, e.g. to press Ctrl-C.
 */
export function scriptedClient(
  recorded: Recorded,
  hooks: {
    beforeObserve?: (index: number) => void;
    cancel?: (runId: string) => CancelResult;
    projects?: ProjectView[];
  } = {},
): ScriptedClient {
  const calls: { tool: string; args: unknown }[] = [];
  let next = 0;
  return {
    calls,
    async start(input) {
      calls.push({ tool: "start_coding_agent", args: input });
      return recorded.start;
    },
    async observe(input, signal) {
      calls.push({ tool: "observe_coding_agent", args: input });
      const index = next++;
      hooks.beforeObserve?.(index);
      await new Promise((resolve) => setImmediate(resolve));
      if (signal?.aborted === true) {
        const error = new Error("aborted");
        error.name = "AbortError";
        throw error;
      }
      const obs = recorded.observations[Math.min(index, recorded.observations.length - 1)];
      if (obs === undefined) throw new Error("no observations recorded");
      return obs;
    },
    async cancel(runId) {
      calls.push({ tool: "cancel_coding_agent", args: { run_id: runId } });
      return (
        hooks.cancel?.(runId) ?? { run_id: runId, state: "running", cancel_requested: true, already_terminal: false }
      );
    },
    async projects() {
      calls.push({ tool: "resources/read", args: { uri: "webcodex://projects" } });
      return hooks.projects ?? [];
    },
    async reset() {},
    async close() {},
  };
}

export function testContext(client: RunsClient, env: NodeJS.ProcessEnv = {}) {
  const stdout = new MemoryStream();
  const stderr = new MemoryStream();
  const interruptHandlers = new Set<() => void>();
  const ctx: CliContext = {
    stdout,
    stderr,
    env: { WEBCODEX_URL: "http://127.0.0.1:7420/mcp", WEBCODEX_TOKEN: "wct_test", ...env },
    readStdin: async () => "prompt from stdin",
    onInterrupt(handler) {
      interruptHandlers.add(handler);
      return () => interruptHandlers.delete(handler);
    },
    createClient: () => client,
  };
  return {
    ctx,
    stdout,
    stderr,
    interrupt: () => {
      for (const handler of interruptHandlers) handler();
    },
  };
}
