/**
 * The webhook tables (schema step 17) on the state engine, both dialects: subscriptions, and the outbox of
 * their events. Nothing is kept in memory: several Server instances share these rows on PostgreSQL.
 *
 * An outbox row's life: `pending` (due at `next_attempt_ms`) → claimed `delivering` (until `lease_until_ms`)
 * → `delivered`, or back to `pending` with a later `next_attempt_ms`, or `dead` (attempts or time used up;
 * `redeliver` makes it `pending` again). A claim (one transaction) takes due rows whose subscription and run
 * have no earlier row still `pending` or `delivering` — so one run's events reach one subscription in order —
 * locked `FOR UPDATE SKIP LOCKED` on PostgreSQL, so that each attempt is made by one instance. A `delivering`
 * row whose lease ran out (its instance died) is `pending` again at the next claim.
 *
 * A subscription is `active`, or `disabled` (by the operator's or the worker's decision, `disable`): a disabled
 * one gets no new events and none of its pending ones is claimed until `enable`. A rotated secret (`rotateSecret`)
 * keeps the previous one until `previous_secret_until_ms`; attempts until then are signed with both. Each change
 * of a subscription writes a `webhook_audit` row in its transaction (at most WEBHOOK_AUDIT_MAX_ROWS kept).
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

export type SubscriptionStatus = "active" | "disabled";
export type OutboxStatus = "pending" | "delivering" | "delivered" | "dead";

export interface Subscription {
  subscription_id: string;
  principal_id: string;
  url: string;
  event_types: EventType[];
  status: SubscriptionStatus;
  consecutive_failures: number;
  last_error: string | null;
  last_attempt_ms: number | null;
  /** Since when every attempt failed (null: the last one succeeded, or none failed yet). */
  failing_since_ms: number | null;
  disabled_at: string | null;
  /** Until when attempts are signed with the previous secret too (after a rotation), or null. */
  previous_secret_until_ms: number | null;
  created_at: string;
}

/** Who changed a subscription (an audit row's `actor`). */
export type WebhookActor = "operator" | "delivery" | `principal:${string}` | `operator_console:${string}`;
export type WebhookAuditEvent = "added" | "removed" | "secret_rotated" | "disabled" | "enabled" | "redelivered";

export interface WebhookAuditRow {
  id: number;
  at: string;
  event: WebhookAuditEvent;
  subscription_id: string;
  principal_id: string;
  actor: string;
  detail: string | null;
}

/** When the worker disables a failing subscription: both bounds passed (`[server.webhooks]` keys). */
export interface DisablePolicy {
  /** Consecutive failed attempts at least. */
  afterFailures: number;
  /** Since the first of them, at least. */
  afterMs: number;
}

/** A subscription as `list` shows it: its counts of events by outbox status. */
export interface SubscriptionListing extends Subscription {
  pending: number;
  delivered: number;
  dead: number;
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

/** Subscriptions one principal may hold at most. */
export const MAX_SUBSCRIPTIONS_PER_PRINCIPAL = 32;
/** Characters of an attempt's error kept in a row. */
export const MAX_ERROR_CHARS = 200;
/** Rows kept in `webhook_audit` (older ones are deleted as new ones come). */
export const WEBHOOK_AUDIT_MAX_ROWS = 10_000;

/** The columns of a subscription that may be shown (never the secrets). */
const SUBSCRIPTION_COLUMNS = `s.subscription_id, s.principal_id, s.url, s.event_types, s.status, s.consecutive_failures,
  s.last_error, s.last_attempt_ms, s.failing_since_ms, s.disabled_at, s.previous_secret_until_ms, s.created_at`;

type SubscriptionRow = Omit<Subscription, "event_types"> & { event_types: string };

const numOrNull = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v));

function fromRow(row: SubscriptionRow): Subscription {
  return {
    subscription_id: row.subscription_id,
    principal_id: row.principal_id,
    url: row.url,
    event_types: JSON.parse(row.event_types) as EventType[],
    status: row.status,
    consecutive_failures: Number(row.consecutive_failures),
    last_error: row.last_error,
    last_attempt_ms: numOrNull(row.last_attempt_ms),
    failing_since_ms: numOrNull(row.failing_since_ms),
    disabled_at: row.disabled_at ?? null,
    previous_secret_until_ms: numOrNull(row.previous_secret_until_ms),
    created_at: row.created_at,
  };
}

/** The secrets an attempt at `nowMs` is signed with: the current one, and the previous one during its overlap. */
export function signingSecrets(
  row: { secret: string; previous_secret: string | null; previous_secret_until_ms: number | string | null },
  nowMs: number,
): string[] {
  const until = numOrNull(row.previous_secret_until_ms);
  return row.previous_secret !== null && until !== null && until > nowMs
    ? [row.secret, row.previous_secret]
    : [row.secret];
}

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

export class SubscriptionLimitError extends Error {
  override readonly name = "SubscriptionLimitError";
}

export class WebhookStore {
  constructor(private readonly engine: StateEngine) {}

  async add(input: {
    principal_id: string;
    url: string;
    event_types: readonly EventType[];
    secret: string;
    actor?: WebhookActor;
  }): Promise<Subscription> {
    const subscription: Subscription = {
      subscription_id: `whsub_${randomBytes(12).toString("base64url")}`,
      principal_id: input.principal_id,
      url: input.url,
      event_types: [...input.event_types],
      status: "active",
      consecutive_failures: 0,
      last_error: null,
      last_attempt_ms: null,
      failing_since_ms: null,
      disabled_at: null,
      previous_secret_until_ms: null,
      created_at: new Date().toISOString(),
    };
    await this.engine.transaction(
      async (tx) => {
        const count = await tx.get<{ n: number }>(
          "SELECT COUNT(*) AS n FROM webhook_subscriptions WHERE principal_id = ?",
          [input.principal_id],
        );
        if (num(count?.n ?? 0) >= MAX_SUBSCRIPTIONS_PER_PRINCIPAL) {
          throw new SubscriptionLimitError(
            `principal ${input.principal_id} already has MAX_SUBSCRIPTIONS_PER_PRINCIPAL = ${MAX_SUBSCRIPTIONS_PER_PRINCIPAL} subscriptions`,
          );
        }
        await tx.run(
          `INSERT INTO webhook_subscriptions (subscription_id, principal_id, url, event_types, secret, status,
             consecutive_failures, created_at) VALUES (?, ?, ?, ?, ?, 'active', 0, ?)`,
          [
            subscription.subscription_id,
            subscription.principal_id,
            subscription.url,
            JSON.stringify(subscription.event_types),
            input.secret,
            subscription.created_at,
          ],
        );
        await this.#audit(tx, "added", subscription, input.actor ?? "operator", subscription.event_types.join(","));
      },
      { lock: `webhook_subscriptions:${input.principal_id}` },
    );
    return subscription;
  }

  /** The subscription with the secrets an attempt now is signed with (`webhooks test`). */
  async get(subscriptionId: string, nowMs = Date.now()): Promise<(Subscription & { secrets: string[] }) | undefined> {
    const row = await this.engine.get<SubscriptionRow & { secret: string; previous_secret: string | null }>(
      "SELECT * FROM webhook_subscriptions WHERE subscription_id = ?",
      [subscriptionId],
    );
    return row ? { ...fromRow(row), secrets: signingSecrets(row, nowMs) } : undefined;
  }

  /** The subscription without its secrets, or undefined. */
  async find(subscriptionId: string, q: StateQueries = this.engine): Promise<Subscription | undefined> {
    const row = await q.get<SubscriptionRow>(
      `SELECT ${SUBSCRIPTION_COLUMNS} FROM webhook_subscriptions s WHERE s.subscription_id = ?`,
      [subscriptionId],
    );
    return row ? fromRow(row) : undefined;
  }

  /**
   * A new secret for the subscription; the one it replaces still signs attempts (a second signature) until
   * `overlapUntilMs`, so a receiver can switch without missing an event. A secret replaced before that keeps no
   * overlap (two secrets at most). False when there is no such subscription.
   */
  async rotateSecret(
    subscriptionId: string,
    secret: string,
    overlapUntilMs: number,
    actor: WebhookActor = "operator",
  ): Promise<boolean> {
    return await this.engine.transaction(async (tx) => {
      const current = await this.find(subscriptionId, tx);
      if (!current) return false;
      await tx.run(
        `UPDATE webhook_subscriptions SET previous_secret = secret, previous_secret_until_ms = ?, secret = ?
         WHERE subscription_id = ?`,
        [overlapUntilMs, secret, subscriptionId],
      );
      await this.#audit(tx, "secret_rotated", current, actor, `previous secret verifies until ${iso(overlapUntilMs)}`);
      return true;
    });
  }

  /** Make a disabled subscription active again, its pending events due now with a fresh retry budget. */
  async enable(subscriptionId: string, nowMs: number, actor: WebhookActor = "operator"): Promise<boolean> {
    return await this.engine.transaction(async (tx) => {
      const current = await this.find(subscriptionId, tx);
      if (!current) return false;
      if (current.status === "active") return true;
      await tx.run(
        `UPDATE webhook_subscriptions SET status = 'active', consecutive_failures = 0, failing_since_ms = NULL,
           disabled_at = NULL WHERE subscription_id = ?`,
        [subscriptionId],
      );
      await tx.run(
        `UPDATE webhook_outbox SET attempts = 0, retry_from_ms = ?, next_attempt_ms = ?
         WHERE subscription_id = ? AND status = 'pending'`,
        [nowMs, nowMs, subscriptionId],
      );
      await this.#audit(tx, "enabled", current, actor, null);
      return true;
    });
  }

  /** The newest `limit` audit rows (of one subscription), newest first. */
  async auditRows(limit: number, subscriptionId?: string): Promise<WebhookAuditRow[]> {
    const rows = await this.engine.all<WebhookAuditRow>(
      `SELECT * FROM webhook_audit ${subscriptionId === undefined ? "" : "WHERE subscription_id = ?"}
       ORDER BY id DESC LIMIT ?`,
      subscriptionId === undefined ? [limit] : [subscriptionId, limit],
    );
    return rows.map((r) => ({ ...r, id: Number(r.id) }));
  }

  async #audit(
    tx: StateQueries,
    event: WebhookAuditEvent,
    subscription: Pick<Subscription, "subscription_id" | "principal_id">,
    actor: WebhookActor,
    detail: string | null,
  ): Promise<void> {
    await tx.run(
      "INSERT INTO webhook_audit (at, event, subscription_id, principal_id, actor, detail) VALUES (?, ?, ?, ?, ?, ?)",
      [new Date().toISOString(), event, subscription.subscription_id, subscription.principal_id, actor, detail],
    );
    await tx.run("DELETE FROM webhook_audit WHERE id <= (SELECT MAX(id) FROM webhook_audit) - ?", [
      WEBHOOK_AUDIT_MAX_ROWS,
    ]);
  }

  /** Every subscription (of one principal), with its counts; never the secret. */
  async list(principalId?: string): Promise<SubscriptionListing[]> {
    const rows = await this.engine.all<SubscriptionRow & { pending: number; delivered: number; dead: number }>(
      `SELECT ${SUBSCRIPTION_COLUMNS},
         (SELECT COUNT(*) FROM webhook_outbox o WHERE o.subscription_id = s.subscription_id
            AND o.status IN ('pending', 'delivering')) AS pending,
         (SELECT COUNT(*) FROM webhook_outbox o WHERE o.subscription_id = s.subscription_id
            AND o.status = 'delivered') AS delivered,
         (SELECT COUNT(*) FROM webhook_outbox o WHERE o.subscription_id = s.subscription_id
            AND o.status = 'dead') AS dead
       FROM webhook_subscriptions s ${principalId === undefined ? "" : "WHERE s.principal_id = ?"}
       ORDER BY s.created_at, s.subscription_id`,
      principalId === undefined ? [] : [principalId],
    );
    return rows.map((r) => ({
      ...fromRow(r),
      pending: num(r.pending),
      delivered: num(r.delivered),
      dead: num(r.dead),
    }));
  }

  /** The subscription and its outbox rows; false when there was none (of `principalId`, when given). */
  async remove(subscriptionId: string, actor: WebhookActor = "operator", principalId?: string): Promise<boolean> {
    return await this.engine.transaction(async (tx) => {
      const current = await this.find(subscriptionId, tx);
      if (!current || (principalId !== undefined && current.principal_id !== principalId)) return false;
      await tx.run("DELETE FROM webhook_outbox WHERE subscription_id = ?", [subscriptionId]);
      await tx.run("DELETE FROM webhook_subscriptions WHERE subscription_id = ?", [subscriptionId]);
      await this.#audit(tx, "removed", current, actor, null);
      return true;
    });
  }

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
      const s = await this.find(event.subscription_id, tx);
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
      await this.#audit(
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
      await this.#audit(tx, "redelivered", row, actor, eventId);
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
