/**
 * The webhook MCP tools (design §18): a principal holding `webhooks:write` lists, adds and removes its own
 * subscriptions — registered next to the run tools as a ToolModule (the router's schema check, error envelope
 * and audit row per call). A subscription of another principal is `not_found`, never shown. `add` checks the
 * receiver like the operator's `webhooks add` (destination.ts, DNS included) and answers the signing secret
 * this once; `list` never shows a secret. Every change writes a `webhook_audit` row naming the principal.
 */
import {
  AddWebhookInput,
  AddWebhookOutput,
  ListWebhooksInput,
  ListWebhooksOutput,
  RemoveWebhookInput,
  RemoveWebhookOutput,
  WEBHOOK_TOOL_NAMES,
  type WebhookToolName,
} from "@webcodex/protocol";
import { missingScopes } from "../principals/authority.js";
import type { Principal } from "../principals/principal.js";
import { fail, ok, type Parsed, type ToolCallOutcome, type ToolModule, type ToolSpec } from "../tools/contract.js";
import { apiError } from "../tools/errors.js";
import { checkDestination, DestinationError, type DestinationPolicy } from "./destination.js";
import { newSecret } from "./signing.js";
import { MAX_SUBSCRIPTIONS_PER_PRINCIPAL, SubscriptionLimitError, type WebhookSubscriptions } from "./subscriptions.js";

/** What the scope refusals of these tools name (principals/authority.ts). */
const WEBHOOKS_WHAT = "Managing webhook subscriptions";

export const WEBHOOK_TOOL_SPECS: readonly ToolSpec<WebhookToolName>[] = [
  {
    name: WEBHOOK_TOOL_NAMES.list,
    title: "List webhook subscriptions",
    description:
      "This principal's webhook subscriptions: receiver URL, event types, active or disabled (after failing for " +
      "long), and counts of events pending, delivered and dead. Never a secret.",
    input: ListWebhooksInput,
    output: ListWebhooksOutput,
    annotations: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  },
  {
    name: WEBHOOK_TOOL_NAMES.add,
    title: "Add a webhook subscription",
    description:
      "Subscribe a receiver URL to this principal's run and task events, signed with Standard Webhooks " +
      "(webhook-id, webhook-timestamp, webhook-signature). The signing secret is in the answer this once.",
    input: AddWebhookInput,
    output: AddWebhookOutput,
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: true },
  },
  {
    name: WEBHOOK_TOOL_NAMES.remove,
    title: "Remove a webhook subscription",
    description: "Remove one of this principal's webhook subscriptions and its undelivered events.",
    input: RemoveWebhookInput,
    output: RemoveWebhookOutput,
    annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
  },
];

export class WebhookTools implements ToolModule {
  readonly specs = WEBHOOK_TOOL_SPECS;
  readonly #store: WebhookSubscriptions;
  readonly #policy: DestinationPolicy;

  constructor(store: WebhookSubscriptions, policy: DestinationPolicy) {
    this.#store = store;
    this.#policy = policy;
  }

  async call(principal: Principal, name: string, input: unknown): Promise<ToolCallOutcome> {
    const denied = missingScopes(principal, ["webhooks:write"], WEBHOOKS_WHAT);
    if (denied) return fail(denied, null);
    const actor = `principal:${principal.id}` as const;
    switch (name as WebhookToolName) {
      case WEBHOOK_TOOL_NAMES.list: {
        const subscriptions = (await this.#store.list(principal.id)).map((s) => ({
          subscription_id: s.subscription_id,
          url: s.url,
          event_types: s.event_types,
          status: s.status,
          consecutive_failures: s.consecutive_failures,
          last_error: s.last_error,
          disabled_at: s.disabled_at,
          pending: s.pending,
          delivered: s.delivered,
          dead: s.dead,
          created_at: s.created_at,
        }));
        return ok(ListWebhooksOutput.parse({ subscriptions }), null);
      }
      case WEBHOOK_TOOL_NAMES.add: {
        const v = input as Parsed<typeof AddWebhookInput>;
        try {
          await checkDestination(v.url, this.#policy);
        } catch (err) {
          if (err instanceof DestinationError) return fail(apiError("invalid_input", err.message), null);
          throw err;
        }
        const secret = newSecret();
        try {
          const s = await this.#store.add({
            principal_id: principal.id,
            url: v.url,
            event_types: [...new Set(v.event_types)],
            secret,
            actor,
          });
          return ok(
            AddWebhookOutput.parse({
              subscription_id: s.subscription_id,
              url: s.url,
              event_types: s.event_types,
              status: "active",
              created_at: s.created_at,
              secret,
            }),
            null,
          );
        } catch (err) {
          if (!(err instanceof SubscriptionLimitError)) throw err;
          return fail(
            {
              code: "capacity",
              message: `This principal already has ${MAX_SUBSCRIPTIONS_PER_PRINCIPAL} webhook subscriptions; remove one first.`,
              recovery_kind: "fix_input",
            },
            null,
          );
        }
      }
      case WEBHOOK_TOOL_NAMES.remove: {
        const { subscription_id } = input as Parsed<typeof RemoveWebhookInput>;
        // Another principal's subscription is not there for this one.
        if (!(await this.#store.remove(subscription_id, actor, principal.id))) {
          return fail(apiError("not_found", `No webhook subscription ${subscription_id}.`), null);
        }
        return ok(RemoveWebhookOutput.parse({ subscription_id, removed: true }), null);
      }
      default:
        throw new Error("unknown webhook tool");
    }
  }
}
