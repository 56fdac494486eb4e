/**
 * The observe tool's output check (`ObserveToolOutput`, the exact shape of its result), with each event
 * checked once, not once per caller it is shown to. Every observer of a run woken by one update is shown the
 * same new events; checking each answer whole parsed those events again for every one of them (at 1,000
 * observers most of the Server's zod time). The mirror holds each event as one object that is never changed
 * in place (runs/mirror.ts), so the checked copy of an event object is remembered with it (a WeakMap: it goes
 * when the event does). The result is what `ObserveToolOutput.parse` of the whole answer gives: the envelope
 * parsed with the same schema, and each event parsed with that schema's own event schema.
 */
import { RunEvent } from "@webcodex/protocol";
import type { z } from "zod";
import type { ObserveOutput } from "./api.js";
import { ObserveToolOutput } from "./tool-schemas.js";

const checked = new WeakMap<object, RunEvent>();

function checkedEvent(e: unknown): RunEvent {
  if (typeof e !== "object" || e === null) return RunEvent.parse(e);
  let copy = checked.get(e);
  if (copy === undefined) {
    copy = RunEvent.parse(e);
    checked.set(e, copy);
  }
  return copy;
}

/** `ObserveToolOutput.parse(value)`, each event's check shared by every answer that shows it. Throws as it does. */
export function checkObserveOutput(value: ObserveOutput): z.infer<typeof ObserveToolOutput> {
  const parsed = ObserveToolOutput.parse({ ...value, events: [] });
  parsed.events = value.events.map(checkedEvent);
  return parsed;
}
