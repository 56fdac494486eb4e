/**
 * The Runner link's bounded send queue (link/link.ts): bytes and frames handed to the socket and not
 * yet written. `run.update` frames wait for room; when there is none that run's events stop being
 * pushed, and once the queue drains below half one state-only update announces it, so the Server
 * re-syncs by seq. Hello, replies, heartbeats and protocol errors go without the limits (`rawSend`).
 */
import {
  encodeFrame,
  eventBatches,
  MAX_EVENTS_PER_UPDATE,
  MAX_FRAME_BYTES,
  type RunEvent,
  type RunnerFrame,
  type RunSummary,
} from "@webcodex/protocol";
import type { Logger } from "pino";
import WebSocket from "ws";

export interface SendQueueDeps {
  log: Logger;
  /** The link's current socket: a write on another one no longer counts. */
  current: () => WebSocket | null;
  /** Whether the current socket completed hello/hello.ack. */
  live: () => boolean;
  /** `sendQueueMaxBytes` / `sendQueueMaxFrames` of LinkOptions. */
  maxBytes: number;
  maxFrames: number;
}

export class SendQueue {
  readonly #d: SendQueueDeps;
  #queuedBytes = 0;
  #queuedFrames = 0;
  /** Runs whose events were not pushed because the queue was full: latest summary to announce. */
  readonly #suppressed = new Map<string, RunSummary>();

  constructor(deps: SendQueueDeps) {
    this.#d = deps;
  }

  /** The socket went away: nothing is queued any more. */
  reset(): void {
    this.#queuedBytes = 0;
    this.#queuedFrames = 0;
    this.#suppressed.clear();
  }

  /** Send without queue limits (hello, replies, heartbeats, protocol errors). */
  rawSend(ws: WebSocket, frame: RunnerFrame): boolean {
    let text: string;
    try {
      text = encodeFrame(frame);
    } catch (err) {
      this.#d.log.error({ type: frame.type, err: (err as Error).message }, "frame too large to send");
      return false;
    }
    this.sendText(ws, text);
    return true;
  }

  sendText(ws: WebSocket, text: string, bytes = Buffer.byteLength(text, "utf8")): void {
    this.#queuedBytes += bytes;
    this.#queuedFrames++;
    ws.send(text, (err) => {
      if (ws !== this.#d.current()) return;
      this.#queuedBytes -= bytes;
      this.#queuedFrames--;
      if (err) return;
      if (this.#suppressed.size > 0) this.#drainSuppressed(ws);
    });
  }

  #hasRoom(extraBytes: number): boolean {
    return this.#queuedBytes + extraBytes <= this.#d.maxBytes && this.#queuedFrames < this.#d.maxFrames;
  }

  /** Called from the run service; must never block or throw. */
  onUpdate(run: RunSummary, events: readonly RunEvent[]): void {
    try {
      const ws = this.#d.current();
      if (!ws || !this.#d.live() || ws.readyState !== WebSocket.OPEN) return; // the next hello + sync covers it
      if (this.#suppressed.has(run.run_id)) {
        this.#suppressed.set(run.run_id, run);
        return;
      }
      // The service pushes frame-sized batches (RunUpdateListener): encode once, and split only a batch that
      // does not fit after all.
      const whole: RunnerFrame = { type: "run.update", run, events: [...events] };
      const wholeText = JSON.stringify(whole);
      const frames: (RunnerFrame | string)[] =
        events.length <= MAX_EVENTS_PER_UPDATE && Buffer.byteLength(wholeText, "utf8") <= MAX_FRAME_BYTES
          ? [wholeText]
          : chunkUpdate(run, events);
      for (const frame of frames) {
        const text = typeof frame === "string" ? frame : JSON.stringify(frame);
        const bytes = Buffer.byteLength(text, "utf8");
        if (!this.#hasRoom(bytes) || bytes > MAX_FRAME_BYTES) {
          this.#suppressed.set(run.run_id, run);
          this.#d.log.debug({ run_id: run.run_id }, "send queue full; run updates paused until it drains");
          return;
        }
        this.sendText(ws, text, bytes);
      }
    } catch (err) {
      this.#d.log.error({ err: (err as Error).message }, "pushing a run update failed");
    }
  }

  /** Below half the queue limit: announce suppressed runs with a state-only update so the Server re-syncs. */
  #drainSuppressed(ws: WebSocket): void {
    for (const [runId, run] of this.#suppressed) {
      if (this.#queuedBytes > this.#d.maxBytes / 2 || this.#queuedFrames > this.#d.maxFrames / 2) {
        return;
      }
      this.#suppressed.delete(runId);
      this.rawSend(ws, { type: "run.update", run, events: [] });
    }
  }
}

/** One service update as run.update frames, batched by the one rule of @webcodex/protocol batches.ts. */
export function chunkUpdate(run: RunSummary, events: readonly RunEvent[]): RunnerFrame[] {
  return eventBatches(events).map((batch) => ({ type: "run.update", run, events: batch }));
}
