/**
 * The webhook tools' contract (design §18): the event types a subscription may ask for, and the closed input and
 * exact output schemas of the three tools with which a principal holding `webhooks:write` manages its own
 * subscriptions. The Server's tools (server webhooks/tools.ts) check with them.
 */
import { z } from "zod";

export const WEBHOOK_TOOL_NAMES = {
  list: "list_webhook_subscriptions",
  add: "add_webhook_subscription",
  remove: "remove_webhook_subscription",
} as const;
export type WebhookToolName = (typeof WEBHOOK_TOOL_NAMES)[keyof typeof WEBHOOK_TOOL_NAMES];

export const WEBHOOK_RUN_EVENT_TYPES = ["run.started", "run.waiting_permission", "run.terminal", "run.lost"] as const;
export const WEBHOOK_TASK_EVENT_TYPES = ["task.attempt_expired", "task.closed"] as const;
/** Every event type a subscription may ask for. */
export const WEBHOOK_EVENT_TYPES = [...WEBHOOK_RUN_EVENT_TYPES, ...WEBHOOK_TASK_EVENT_TYPES] as const;
export const WebhookEventType = z.enum(WEBHOOK_EVENT_TYPES);

/** Longest receiver URL accepted. */
export const MAX_WEBHOOK_URL_LENGTH = 2048;
export const SUBSCRIPTION_ID_PATTERN = /^whsub_[A-Za-z0-9_-]{16}$/;

const SubscriptionId = z
  .string()
  .regex(SUBSCRIPTION_ID_PATTERN, "must be whsub_ followed by 16 base64url characters")
  .describe("A subscription_id from list_webhook_subscriptions or add_webhook_subscription.");

const SubscriptionView = z
  .object({
    subscription_id: z.string(),
    url: z.string(),
    event_types: z.array(WebhookEventType),
    status: z.enum(["active", "disabled"]),
    consecutive_failures: z.number().int(),
    last_error: z.string().nullable(),
    disabled_at: z.string().nullable(),
    pending: z.number().int(),
    delivered: z.number().int(),
    dead: z.number().int(),
    created_at: z.string(),
  })
  .strict();

export const ListWebhooksInput = z.object({}).strict();
export const ListWebhooksOutput = z.object({ subscriptions: z.array(SubscriptionView) }).strict();

export const AddWebhookInput = z
  .object({
    url: z
      .string()
      .min(1)
      .max(MAX_WEBHOOK_URL_LENGTH)
      .describe("The receiver: https (plain http only to loopback, and only where the operator allows it)."),
    event_types: z
      .array(WebhookEventType)
      .min(1)
      .max(WEBHOOK_EVENT_TYPES.length)
      .describe("The events to send: run.* for this principal's runs, task.* for its managed tasks."),
  })
  .strict();
export const AddWebhookOutput = z
  .object({
    subscription_id: z.string(),
    url: z.string(),
    event_types: z.array(WebhookEventType),
    status: z.literal("active"),
    created_at: z.string(),
    secret: z
      .string()
      .describe("The Standard Webhooks signing secret (whsec_…), shown this once: give it to the receiver now."),
  })
  .strict();

export const RemoveWebhookInput = z.object({ subscription_id: SubscriptionId }).strict();
export const RemoveWebhookOutput = z.object({ subscription_id: z.string(), removed: z.literal(true) }).strict();
