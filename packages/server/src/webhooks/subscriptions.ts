/**
 * Webhook subscriptions on the state engine (schema step 17), both dialects: who receives which events where,
 * signed with which secret. Nothing is kept in memory: several Server instances share these rows on PostgreSQL.
 * Their events, and their delivery, are the outbox's (outbox.ts).
 *
 * A subscription is `active`, or `disabled` (by the operator's or the worker's decision, `disable`): a disabled
 * one gets no new events and none of its pending ones is claimed until `enable`. A rotated secret (`rotateSecret`)
 * keeps the previous one until `previous_secret_until_ms`; attempts until then are signed with both. Each change
 * of a subscription writes a `webhook_audit` row in its transaction (at most WEBHOOK_AUDIT_MAX_ROWS kept,
 * `auditChange`, which the outbox's worker-side changes use too).
 */
import { randomBytes } from "node:crypto";
import type { StateEngine, StateQueries } from "../state/engine.js";
import type { EventType } from "./events.js";

export type SubscriptionStatus = "active" | "disabled";

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

/** A subscription as `list` shows it: its counts of events by outbox status. */
export interface SubscriptionListing extends Subscription {
  pending: number;
  delivered: number;
  dead: number;
}

/** Subscriptions one principal may hold at most. */
export const MAX_SUBSCRIPTIONS_PER_PRINCIPAL = 32;
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

/** The subscription without its secrets, or undefined (read on `q`: the engine or a transaction). */
export async function findSubscription(q: StateQueries, subscriptionId: string): Promise<Subscription | undefined> {
  const row = await q.get<SubscriptionRow>(
    `SELECT ${SUBSCRIPTION_COLUMNS} FROM webhook_subscriptions s WHERE s.subscription_id = ?`,
    [subscriptionId],
  );
  return row ? fromRow(row) : undefined;
}

/** Writes the `webhook_audit` row of a subscription's change on `tx`, the transaction of that change. */
export async function auditChange(
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

export class SubscriptionLimitError extends Error {
  override readonly name = "SubscriptionLimitError";
}

export class WebhookSubscriptions {
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
        await auditChange(tx, "added", subscription, input.actor ?? "operator", subscription.event_types.join(","));
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
  async find(subscriptionId: string): Promise<Subscription | undefined> {
    return await findSubscription(this.engine, subscriptionId);
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
      const current = await findSubscription(tx, subscriptionId);
      if (!current) return false;
      await tx.run(
        `UPDATE webhook_subscriptions SET previous_secret = secret, previous_secret_until_ms = ?, secret = ?
         WHERE subscription_id = ?`,
        [overlapUntilMs, secret, subscriptionId],
      );
      await auditChange(tx, "secret_rotated", current, actor, `previous secret verifies until ${iso(overlapUntilMs)}`);
      return true;
    });
  }

  /** Make a disabled subscription active again, its pending events due now with a fresh retry budget. */
  async enable(subscriptionId: string, nowMs: number, actor: WebhookActor = "operator"): Promise<boolean> {
    return await this.engine.transaction(async (tx) => {
      const current = await findSubscription(tx, subscriptionId);
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
      await auditChange(tx, "enabled", current, actor, null);
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
      const current = await findSubscription(tx, subscriptionId);
      if (!current || (principalId !== undefined && current.principal_id !== principalId)) return false;
      await tx.run("DELETE FROM webhook_outbox WHERE subscription_id = ?", [subscriptionId]);
      await tx.run("DELETE FROM webhook_subscriptions WHERE subscription_id = ?", [subscriptionId]);
      await auditChange(tx, "removed", current, actor, null);
      return true;
    });
  }
}
