/**
 * The webhook outbox (schema step 17) on the state engine, both dialects: the events of the subscriptions
 * (subscriptions.ts), written in the transaction of the change that causes them, and their delivery's claims and
 * outcomes. Nothing is kept in memory: several Server instances share these rows on PostgreSQL.
 *
 * An outbox row's life: `pending` (due at `next_attempt_ms`) → claimed `delivering` (until `lease_until_ms`)
 * → `delivered`, or back to `pending` with a later `next_attempt_ms`, or `dead` (attempts or time used up;
 * `redeliver` makes it `pending` again). A claim (one transaction) takes due rows whose subscription and run
 * have no earlier row still `pending` or `delivering` — so one run's events reach one subscription in order —
 * locked `FOR UPDATE SKIP LOCKED` on PostgreSQL, so that each attempt is made by one instance. A `delivering`
 * row whose lease ran out (its instance died) is `pending` again at the next claim. A disabled subscription's
 * rows are not claimed.
 *
 * An outbox row's `run_id` is its order key: the run's id for a `run.*` event, the task's id for a `task.*` one
 * (so a task's events, too, reach a subscription in order).
 */
import { randomBytes } from "node:crypto";
import type { RunState } from "@webcodex/protocol";
import type { StateEngine, StateQueries } from "../state/engine.js";
import type { AdmissionRecord } from "../state/record.js";
import type { TaskChange } from "../tasks/changes.js";
import { type EventType, eventBody, eventsFor, taskEventBody, taskEventType } from "./events.js";
import { auditChange, findSubscription, signingSecrets, type WebhookActor } from "./subscriptions.js";

export type OutboxStatus = "pending" | "delivering" | "delivered" | "dead";

/** When the worker disables a failing subscription: both bounds passed (`[server.webhooks]` keys). */
export interface DisablePolicy {
  /** Consecutive failed attempts at least. */
  afterFailures: number;
  /** Since the first of them, at least. */
  afterMs: number;
}
export interface OutboxRow {
  seq: number;
  event_id: string;
  subscription_id: string;
  run_id: string;
  event_type: string;
  body: string;
  status: OutboxStatus;
  attempts: number;
  created_ms: number;
  retry_from_ms: number;
  next_attempt_ms: number;
  last_status: number | null;
  last_error: string | null;
}

/** A claimed row with what its attempt needs: the secrets it is signed with (the current one first). */
export interface ClaimedEvent extends OutboxRow {
  url: string;
  secrets: string[];
}

/**
 * Claims and outcomes commit without an fsync of their own on SQLite (state/engine.ts `durability`): one lost to
 * a power cut only makes an attempt happen again, with the same id — delivery is at least once anyway.
 */
const RELAXED = { durability: "relaxed" } as const;

/** Characters of an attempt's error kept in a row. */
export const MAX_ERROR_CHARS = 200;

const num = (v: unknown): number => Number(v);
const iso = (ms: number): string => new Date(ms).toISOString();

function numericOutbox<T extends OutboxRow>(row: T): T {
  return {
    ...row,
    seq: num(row.seq),
    attempts: num(row.attempts),
    created_ms: num(row.created_ms),
    retry_from_ms: num(row.retry_from_ms),
    next_attempt_ms: num(row.next_attempt_ms),
    last_status: row.last_status === null ? null : num(row.last_status),
  };
}

export class WebhookOutbox {
  constructor(private readonly engine: StateEngine) {}

  /**
   * The events of one record's state change, written on `tx` (the transaction of that change): one row per
   * event and active subscription of the record's principal that asked for it.
   */
  async enqueue(tx: StateQueries, record: AdmissionRecord, previous: RunState, nowMs: number): Promise<number> {
    const types = eventsFor(record, previous);
    if (types.length === 0) return 0;
    const subscriptions = await tx.all<{ subscription_id: string; event_types: string }>(
      "SELECT subscription_id, event_types FROM webhook_subscriptions WHERE principal_id = ? AND status = 'active'",
      [record.principal_id],
    );
    let written = 0;
    for (const type of types) {
      const body = eventBody(type, record, nowMs);
      for (const s of subscriptions) {
        if (!(JSON.parse(s.event_types) as string[]).includes(type)) continue;
        await this.#insert(tx, s.subscription_id, record.run_id, type, body, nowMs);
        written += 1;
      }
    }
    return written;
  }

  /**
   * The event of one task change, written on `tx` (the transaction of that change): one row per active
   * subscription of the task's principal that asked for it, ordered with the task's other events.
   */
  async enqueueTask(tx: StateQueries, change: TaskChange, nowMs: number): Promise<number> {
    const type = taskEventType(change);
    const subscriptions = await tx.all<{ subscription_id: string; event_types: string }>(
      "SELECT subscription_id, event_types FROM webhook_subscriptions WHERE principal_id = ? AND status = 'active'",
      [change.task.principal_id],
    );
    const body = taskEventBody(change, nowMs);
    let written = 0;
    for (const s of subscriptions) {
      if (!(JSON.parse(s.event_types) as string[]).includes(type)) continue;
      await this.#insert(tx, s.subscription_id, change.task.task_id, type, body, nowMs);
      written += 1;
    }
    return written;
  }

  async #insert(
    tx: StateQueries,
    subscriptionId: string,
    orderKey: string,
    type: EventType,
    body: string,
    nowMs: number,
  ): Promise<void> {
    await tx.run(
      `INSERT INTO webhook_outbox (event_id, subscription_id, run_id, event_type, body, status, attempts,
         created_ms, retry_from_ms, next_attempt_ms) VALUES (?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?)`,
      [`msg_${randomBytes(16).toString("base64url")}`, subscriptionId, orderKey, type, body, nowMs, nowMs, nowMs],
    );
  }

  /**
   * Claim up to `limit` due events for delivery by this instance, until `leaseUntilMs` (see the header).
   * `accept` picks, among the due rows in order, the ones this instance has room for (its concurrency caps).
   */
  async claim(
    nowMs: number,
    limit: number,
    leaseUntilMs: number,
    accept: (row: ClaimedEvent) => boolean,
  ): Promise<ClaimedEvent[]> {
    // Most polls find nothing: a plain read first, and the claiming transaction only when something is due.
    const due = await this.engine.get<{ due: number }>(
      `SELECT 1 AS due FROM webhook_outbox WHERE (status = 'pending' AND next_attempt_ms <= ?)
         OR (status = 'delivering' AND lease_until_ms < ?) LIMIT 1`,
      [nowMs, nowMs],
    );
    if (due === undefined) return [];
    return await this.engine.transaction(async (tx) => {
      await tx.run("UPDATE webhook_outbox SET status = 'pending' WHERE status = 'delivering' AND lease_until_ms < ?", [
        nowMs,
      ]);
      const skipLocked = this.engine.dialect === "postgres" ? " FOR UPDATE OF o SKIP LOCKED" : "";
      const due = await tx.all<
        OutboxRow & { url: string; secret: string; previous_secret: string | null; previous_secret_until_ms: number }
      >(
        `SELECT o.seq, o.event_id, o.subscription_id, o.run_id, o.event_type, o.body, o.status, o.attempts,
           o.created_ms, o.retry_from_ms, o.next_attempt_ms, o.last_status, o.last_error, s.url, s.secret,
           s.previous_secret, s.previous_secret_until_ms
         FROM webhook_outbox o JOIN webhook_subscriptions s ON s.subscription_id = o.subscription_id
         WHERE o.status = 'pending' AND o.next_attempt_ms <= ? AND s.status = 'active'
           AND NOT EXISTS (SELECT 1 FROM webhook_outbox p WHERE p.subscription_id = o.subscription_id
             AND p.run_id = o.run_id AND p.seq < o.seq AND p.status IN ('pending', 'delivering'))
         ORDER BY o.seq LIMIT ?${skipLocked}`,
        [nowMs, limit],
      );
      const claimed: ClaimedEvent[] = [];
      for (const { secret, previous_secret, previous_secret_until_ms, ...raw } of due) {
        const row: ClaimedEvent = {
          ...numericOutbox(raw),
          secrets: signingSecrets({ secret, previous_secret, previous_secret_until_ms }, nowMs),
        };
        if (!accept(row)) continue;
        await tx.run(
          "UPDATE webhook_outbox SET status = 'delivering', attempts = attempts + 1, lease_until_ms = ? WHERE seq = ?",
          [leaseUntilMs, row.seq],
        );
        claimed.push({ ...row, status: "delivering", attempts: row.attempts + 1 });
      }
      return claimed;
    }, RELAXED);
  }

  /**
   * Record an attempt's outcome: delivered, retried at `retryAtMs`, or dead (`retryAtMs` null). A failure that
   * makes the subscription's run of failures pass both bounds of `disable` disables it (with an audit row).
   * Returns whether it did.
   */
  async settle(
    event: ClaimedEvent,
    outcome: { ok: true; status: number } | { ok: false; status: number | null; error: string },
    nowMs: number,
    retryAtMs: number | null,
    disable?: DisablePolicy,
  ): Promise<{ disabled: boolean }> {
    const error = outcome.ok ? null : outcome.error.slice(0, MAX_ERROR_CHARS);
    return await this.engine.transaction(async (tx) => {
      // Only while this claim still holds it (not handed to another instance after its lease ran out).
      const status: OutboxStatus = outcome.ok ? "delivered" : retryAtMs === null ? "dead" : "pending";
      const { changes } = await tx.run(
        `UPDATE webhook_outbox SET status = ?, next_attempt_ms = ?, delivered_ms = ?, last_status = ?, last_error = ?,
           lease_until_ms = NULL WHERE seq = ? AND status = 'delivering' AND attempts = ?`,
        [
          status,
          retryAtMs ?? event.next_attempt_ms,
          outcome.ok ? nowMs : null,
          outcome.status,
          error,
          event.seq,
          event.attempts,
        ],
      );
      if (changes === 0) return { disabled: false };
      if (outcome.ok) {
        await tx.run(
          `UPDATE webhook_subscriptions SET consecutive_failures = 0, failing_since_ms = NULL, last_error = NULL,
             last_attempt_ms = ? WHERE subscription_id = ?`,
          [nowMs, event.subscription_id],
        );
        return { disabled: false };
      }
      await tx.run(
        `UPDATE webhook_subscriptions SET consecutive_failures = consecutive_failures + 1, last_error = ?,
           last_attempt_ms = ?, failing_since_ms = COALESCE(failing_since_ms, ?) WHERE subscription_id = ?`,
        [error, nowMs, nowMs, event.subscription_id],
      );
      if (disable === undefined) return { disabled: false };
      const s = await findSubscription(tx, event.subscription_id);
      if (
        s?.status !== "active" ||
        s.consecutive_failures < disable.afterFailures ||
        nowMs - (s.failing_since_ms ?? nowMs) < disable.afterMs
      ) {
        return { disabled: false };
      }
      await tx.run("UPDATE webhook_subscriptions SET status = 'disabled', disabled_at = ? WHERE subscription_id = ?", [
        iso(nowMs),
        event.subscription_id,
      ]);
      await auditChange(
        tx,
        "disabled",
        s,
        "delivery",
        `${s.consecutive_failures} consecutive failed attempts since ${iso(s.failing_since_ms ?? nowMs)}`,
      );
      return { disabled: true };
    }, RELAXED);
  }

  /** Every event of one subscription (or all), newest first, at most `limit`. */
  async events(filter: { subscription_id?: string; status?: OutboxStatus }, limit: number): Promise<OutboxRow[]> {
    const where: string[] = [];
    const params: (string | number)[] = [];
    if (filter.subscription_id !== undefined) {
      where.push("subscription_id = ?");
      params.push(filter.subscription_id);
    }
    if (filter.status !== undefined) {
      where.push("status = ?");
      params.push(filter.status);
    }
    params.push(limit);
    const rows = await this.engine.all<OutboxRow>(
      `SELECT seq, event_id, subscription_id, run_id, event_type, body, status, attempts, created_ms, retry_from_ms,
         next_attempt_ms, last_status, last_error FROM webhook_outbox
       ${where.length > 0 ? `WHERE ${where.join(" AND ")}` : ""} ORDER BY seq DESC LIMIT ?`,
      params,
    );
    return rows.map(numericOutbox);
  }

  /**
   * A dead letter made due again with a fresh retry budget, audited (`redelivered`, the event id as detail) in the
   * same transaction; false when `eventId` is not a dead letter. The CLI (`actor` "operator") and the console
   * (`operator_console:<principal>`) both come here.
   */
  async redeliver(eventId: string, nowMs: number, actor: WebhookActor = "operator"): Promise<boolean> {
    return await this.engine.transaction(async (tx) => {
      const row = await tx.get<{ subscription_id: string; principal_id: string }>(
        `SELECT o.subscription_id, s.principal_id FROM webhook_outbox o
         JOIN webhook_subscriptions s ON s.subscription_id = o.subscription_id
         WHERE o.event_id = ? AND o.status = 'dead'`,
        [eventId],
      );
      if (!row) return false;
      const { changes } = await tx.run(
        `UPDATE webhook_outbox SET status = 'pending', attempts = 0, retry_from_ms = ?, next_attempt_ms = ?
         WHERE event_id = ? AND status = 'dead'`,
        [nowMs, nowMs, eventId],
      );
      if (changes === 0) return false;
      await auditChange(tx, "redelivered", row, actor, eventId);
      return true;
    });
  }

  /** SQLite (one Server per state dir): what a previous process left `delivering` is due again now. */
  async releaseClaims(): Promise<number> {
    const { changes } = await this.engine.run(
      "UPDATE webhook_outbox SET status = 'pending', lease_until_ms = NULL WHERE status = 'delivering'",
    );
    return changes;
  }
}
