/**
 * What a turn yields (acp/turn.ts) and how it is handed to the run that consumes it (runs/manager.ts).
 *
 * The turn tells events from its own steps and from the connection's callbacks (session updates,
 * permission requests, the prompt written); `drain` yields them in order to the consumer, which records
 * each before the next is yielded. Told events wait at most until the next microtask checkpoint, so the
 * run's record is never behind the turn when the Runner handles its next message.
 */
import type { EffectiveConfigEntry } from "@webcodex/protocol";
import type { AgentChild } from "../process/spawn.js";
import type { AcpClientConnection } from "./session.js";

/** The setup stages a turn reports as done, in order (runs/timings.ts laps them into the `run timings` line). */
export const TIMED_STAGES = ["spawn", "initialize", "session_new", "config", "barrier_commit", "prompt_write"] as const;
export type TimedStage = (typeof TIMED_STAGES)[number];

/** What a turn yields: each is something the run records (runs/manager.ts), in the order it happened. */
export type TurnEvent =
  /** The agent process is up: the run owns its tree's cleanup from now on. */
  | { kind: "spawned"; child: AgentChild }
  /** The ACP connection is open over the child's stdio: phase `setup`. */
  | { kind: "setup"; conn: AcpClientConnection }
  /** Config sequencing is done: the redacted effective config (the turn records it in the store right after). */
  | { kind: "configured"; effective: EffectiveConfigEntry[] }
  /** The barrier is durable: phase `dispatch_barrier`, state running, execution started, recovery wait. */
  | { kind: "dispatched" }
  /** A permission request is waiting (`waiting_permission`), or none is any more (`running`). */
  | { kind: "state"; state: "waiting_permission" | "running" }
  /** New events are in the run's ring, or its counters (ignored updates, usage) changed: push soon. */
  | { kind: "events" }
  /** A setup stage is done, at `at` (performance.now()). */
  | { kind: "milestone"; stage: TimedStage; at: number };

/** One told event, and what follows it once the run has recorded it. */
interface Told {
  event: TurnEvent;
  then?: (() => void) | undefined;
}

/**
 * The queue between a turn and its consumer. Bounded by construction: the flow's own kinds are told once
 * per turn, `events` and `state` are coalesced (the latest state wins), so it never holds more than
 * TIMED_STAGES plus six.
 */
export class TurnEventQueue {
  readonly #queue: Told[] = [];
  #wake: (() => void) | null = null;
  #closed = false;

  /** Queue `event`; `then` runs once the consumer has recorded it (at once when the queue is closed). */
  tell(event: TurnEvent, then?: () => void): void {
    if (this.#closed) {
      then?.();
      return;
    }
    if (event.kind === "events" && this.#queue.some((t) => t.event.kind === "events")) return;
    const state = event.kind === "state" ? this.#queue.find((t) => t.event.kind === "state") : undefined;
    if (state !== undefined) state.event = event;
    else this.#queue.push({ event, then });
    this.wake();
  }

  /** Wake the drain (something was told, or `done` may have turned true). */
  wake(): void {
    const wake = this.#wake;
    this.#wake = null;
    wake?.();
  }

  /** Yield every told event in order until `done()` holds with nothing left; then the queue is closed. */
  async *drain(done: () => boolean): AsyncGenerator<TurnEvent, void, undefined> {
    try {
      for (;;) {
        for (let told = this.#queue.shift(); told !== undefined; told = this.#queue.shift()) {
          yield told.event;
          told.then?.();
        }
        if (done()) return;
        await new Promise<void>((resolve) => {
          this.#wake = resolve;
        });
      }
    } finally {
      this.#closed = true;
      for (const told of this.#queue.splice(0)) told.then?.();
    }
  }
}
