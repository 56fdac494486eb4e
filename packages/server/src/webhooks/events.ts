/**
 * What a webhook says (design §18): which record changes make which events, and the one builder of their
 * bodies. A body carries ids, states, times and counts of the run — never a prompt, agent text, a message,
 * a path, an env value or a key: it is built from the fields named here and nothing else of the record.
 *
 * | the record's state changes …                                   | events, in this order                 |
 * | -------------------------------------------------------------- | ------------------------------------- |
 * | from `starting` to `running` or `waiting_permission`           | `run.started` (+ `run.waiting_permission`) |
 * | from `starting` straight to an end, after execution began      | `run.started`, then the end's event   |
 * | to `waiting_permission`                                         | `run.waiting_permission`              |
 * | to `lost`                                                       | `run.lost`                            |
 * | to `completed`, `failed` or `cancelled`                          | `run.terminal`                        |
 *
 * A run that ends without having started (refused before admission, never admitted) gets `run.terminal`
 * alone, with `execution_state: "not_started"`.
 *
 * A managed task's changes (tasks/changes.ts) make `task.attempt_expired` (the current attempt's lease ran out,
 * once per claim generation) and `task.closed`; their bodies carry the task's and attempt's ids, fence,
 * generation, outcome and counts — never the instruction, the title or the assignee (free text of the caller).
 */
import {
  isTerminalState,
  type RunState,
  WEBHOOK_EVENT_TYPES,
  WEBHOOK_RUN_EVENT_TYPES,
  WEBHOOK_TASK_EVENT_TYPES,
  WebhookEventType,
} from "@webcodex/protocol";
import { z } from "zod";
import type { AdmissionRecord } from "../state/record.js";
import type { TaskChange } from "../tasks/changes.js";

// The event types are the tools' contract (the protocol package's tools/webhooks.ts).
export const RUN_EVENT_TYPES = WEBHOOK_RUN_EVENT_TYPES;
export const RunEventType = z.enum(RUN_EVENT_TYPES);
export type RunEventType = z.infer<typeof RunEventType>;
export const TASK_EVENT_TYPES = WEBHOOK_TASK_EVENT_TYPES;
export type TaskEventType = (typeof TASK_EVENT_TYPES)[number];
/** Every event type a subscription may ask for. */
export const EVENT_TYPES = WEBHOOK_EVENT_TYPES;
export const EventType = WebhookEventType;
export type EventType = z.infer<typeof EventType>;
/** The event `webhooks test` sends (never written to the outbox, never subscribed to). */
export const PING_EVENT_TYPE = "webhook.ping";

/** The events one change of a record's state causes, in the order they are delivered. */
export function eventsFor(record: AdmissionRecord, previous: RunState): RunEventType[] {
  const out: RunEventType[] = [];
  const ended = isTerminalState(record.state);
  if (previous === "starting" && record.state !== "starting") {
    if (!ended || record.execution_state !== "not_started") out.push("run.started");
  }
  if (record.state === "waiting_permission") out.push("run.waiting_permission");
  else if (record.state === "lost") out.push("run.lost");
  else if (ended) out.push("run.terminal");
  return out;
}

/** The JSON body of one event (Standard Webhooks' `{type, timestamp, data}`), built from ids, states and counts. */
export function eventBody(type: RunEventType, record: AdmissionRecord, nowMs: number): string {
  const ended = isTerminalState(record.state);
  const data: Record<string, unknown> = {
    run_id: record.run_id,
    principal_id: record.principal_id,
    project_id: record.project_id,
    provider_id: record.provider_id,
    state: record.state,
    execution_state: record.execution_state,
    created_at: record.created_at,
  };
  if (ended) {
    data.failure_kind = record.failure_kind;
    data.stop_reason = record.stop_reason;
    data.ended_at = record.updated_at;
    data.duration_ms = Math.max(0, Date.parse(record.updated_at) - Date.parse(record.created_at));
    data.usage = {
      used_tokens: record.usage_used_tokens,
      context_size: record.usage_context_size,
      cost_amount: record.usage_cost_amount,
      cost_currency: record.usage_cost_currency,
    };
  }
  return JSON.stringify({ type, timestamp: new Date(nowMs).toISOString(), data });
}

/** The body of a ping (`webhooks test`): the subscription's id and nothing else. */
export function pingBody(subscriptionId: string, nowMs: number): string {
  return JSON.stringify({
    type: PING_EVENT_TYPE,
    timestamp: new Date(nowMs).toISOString(),
    data: { subscription_id: subscriptionId },
  });
}

/** The event type of a task change. */
export function taskEventType(change: TaskChange): TaskEventType {
  return change.kind === "closed" ? "task.closed" : "task.attempt_expired";
}

/** The JSON body of a task change's event: ids, states, times and counts of the task and attempt only. */
export function taskEventBody(change: TaskChange, nowMs: number): string {
  const { task } = change;
  const data: Record<string, unknown> = {
    task_id: task.task_id,
    principal_id: task.principal_id,
    project_id: task.project_id,
    created_at: task.created_at,
  };
  if (change.kind === "closed") {
    data.outcome = task.outcome;
    data.closed_at = task.closed_at;
    data.attempts = change.attempts;
    data.runs = change.runs;
  } else {
    const { attempt } = change;
    data.attempt_id = attempt.attempt_id;
    data.fence = Number(attempt.fence);
    data.controller_generation = Number(attempt.controller_generation);
    data.lease_expired_at = new Date(Number(attempt.lease_expires_ms)).toISOString();
    data.run_id = change.run_id;
  }
  return JSON.stringify({ type: taskEventType(change), timestamp: new Date(nowMs).toISOString(), data });
}
