/**
 * Less event noise without losing information (issue 20 §3): the normalizer
 * offers every finished non-text event body here; at most ONE body is held
 * back, and a following body that only restates it replaces it:
 *
 *   - `usage` after `usage` → the latest (each is a full snapshot);
 *   - `tool_activity` for the same tool call with the same status → the
 *     latest (agents re-announce a call while refining its title);
 *   - `agent_state` after `agent_state` of the same `change` → the latest
 *     (each is a snapshot of the mode / options / commands / title).
 *
 * Anything else releases the held body first, so order is preserved. The
 * owner releases a held body at its flush window (`releaseDue`, the same
 * pacer that flushes streamed text) and at the end of the run (`release`).
 * A `pending` tool call is held longer — up to PENDING_TOOL_HOLD_MS from
 * when it was first held — because agents announce a call as soon as its
 * input starts streaming and refine the title when the input is complete;
 * any other event still releases it at once.
 */
import type { RunEventBody } from "@webcodex/protocol";

/** Longest time a `pending` tool call waits for a refined re-announcement before it becomes an event. */
export const PENDING_TOOL_HOLD_MS = 1000;

export interface CoalescerOptions {
  /** Receives every body that leaves, in order. */
  emit: (body: RunEventBody) => void;
  /** A body is held: arrange a `releaseDue()` call after at least `delayMs` (0: at the next flush window). */
  schedule: (delayMs: number) => void;
  /** Monotonic ms clock. */
  now: () => number;
  pendingToolHoldMs?: number;
}

type Holdable = Extract<RunEventBody, { kind: "usage" | "tool_activity" | "agent_state" }>;

function holdable(body: RunEventBody): body is Holdable {
  return body.kind === "usage" || body.kind === "tool_activity" || body.kind === "agent_state";
}

/** `next` restates `held`: same snapshot kind, or the same tool call in the same status. */
export function restates(held: RunEventBody, next: RunEventBody): boolean {
  if (held.kind === "usage") return next.kind === "usage";
  if (held.kind === "tool_activity") {
    return next.kind === "tool_activity" && next.tool_call_id === held.tool_call_id && next.status === held.status;
  }
  if (held.kind === "agent_state") return next.kind === "agent_state" && next.change === held.change;
  return false;
}

export class EventCoalescer {
  #held: Holdable | null = null;
  /** When the held body (or the first body it replaced) was held. */
  #heldAt = 0;
  readonly #o: CoalescerOptions;
  readonly #pendingHoldMs: number;

  constructor(options: CoalescerOptions) {
    this.#o = options;
    this.#pendingHoldMs = options.pendingToolHoldMs ?? PENDING_TOOL_HOLD_MS;
  }

  /** The body held back right now (for tests and for dedup against what is not yet out). */
  get held(): RunEventBody | null {
    return this.#held;
  }

  offer(body: RunEventBody): void {
    const held = this.#held;
    if (held !== null && restates(held, body)) {
      this.#held = body as Holdable;
      return;
    }
    this.release();
    if (!holdable(body)) {
      this.#o.emit(body);
      return;
    }
    this.#held = body;
    this.#heldAt = this.#o.now();
    this.#o.schedule(this.#holdFor(body));
  }

  /** Emit the held body now (another kind of output follows, or the run ends). */
  release(): void {
    const held = this.#held;
    if (held === null) return;
    this.#held = null;
    this.#o.emit(held);
  }

  /** The flush window passed: emit the held body unless it is a pending tool call still inside its hold. */
  releaseDue(): void {
    const held = this.#held;
    if (held === null) return;
    const left = this.#heldAt + this.#holdFor(held) - this.#o.now();
    if (left > 0) {
      this.#o.schedule(left);
      return;
    }
    this.release();
  }

  #holdFor(body: Holdable): number {
    return body.kind === "tool_activity" && body.status === "pending" ? this.#pendingHoldMs : 0;
  }
}
