/**
 * `webcodex-server webhooks add|list|remove|rotate-secret|enable|audit|test|redeliver` — the operator's management
 * of signed webhooks (design §18, webhooks/). `add` checks the URL (https, or loopback http when `[server.webhooks]
 * allow_loopback_http`; no private, link-local or metadata address) and prints the signing secret once, on
 * stdout; `rotate-secret` prints the new one once, the old one still signing (a second signature) for
 * `--overlap-secs` (default SECRET_OVERLAP_SECS); `list` never shows a secret, and shows a disabled subscription as
 * such; `enable` turns one back on; `audit` prints the newest changes of subscriptions.
 *
 *   webcodex-server webhooks add --config server.toml --principal alice --url https://ci.example/hook \
 *       --events run.started,run.terminal
 *   webcodex-server webhooks list --config server.toml [--principal alice] [--json]
 *   webcodex-server webhooks remove --config server.toml --id whsub_...
 *   webcodex-server webhooks rotate-secret --config server.toml --id whsub_... [--overlap-secs 86400]
 *   webcodex-server webhooks enable --config server.toml --id whsub_...
 *   webcodex-server webhooks audit --config server.toml [--id whsub_...] [--json]
 *   webcodex-server webhooks test --config server.toml --id whsub_...
 *   webcodex-server webhooks redeliver --config server.toml --event msg_...
 */
import { parseArgs } from "node:util";
import { loadServerConfig } from "../config.js";
import { openState } from "../state/open.js";
import { attemptDelivery } from "../webhooks/delivery.js";
import { checkDestination, DestinationError } from "../webhooks/destination.js";
import { EVENT_TYPES, type EventType, pingBody } from "../webhooks/events.js";
import { WebhookOutbox } from "../webhooks/outbox.js";
import { newSecret } from "../webhooks/signing.js";
import { SubscriptionLimitError, WebhookSubscriptions } from "../webhooks/subscriptions.js";
import { onState } from "./on-state.js";

/** How long a rotated-out secret still signs attempts by default (a second signature): one day. */
export const SECRET_OVERLAP_SECS = 24 * 3600;
/** `--overlap-secs` at most: a week. */
export const MAX_SECRET_OVERLAP_SECS = 7 * 24 * 3600;
/** Audit rows `audit` prints at most (newest first). */
export const LIST_AUDIT_MAX = 100;

import { commandUsage } from "./help.js";

const USAGE = commandUsage("webhooks");
/** Dead letters `list` prints at most (newest first). */
export const LIST_DEAD_LETTERS_MAX = 100;

/** Returns the process exit code. */
export async function runWebhooksCommand(argv: readonly string[]): Promise<number> {
  const [sub, ...rest] = argv;
  let values: {
    config?: string;
    principal?: string;
    url?: string;
    events?: string;
    id?: string;
    event?: string;
    "overlap-secs"?: string;
    json?: boolean;
  };
  try {
    ({ values } = parseArgs({
      args: [...rest],
      options: {
        config: { type: "string" },
        principal: { type: "string" },
        url: { type: "string" },
        events: { type: "string" },
        id: { type: "string" },
        event: { type: "string" },
        "overlap-secs": { type: "string" },
        json: { type: "boolean" },
      },
      strict: true,
    }));
  } catch (err) {
    console.error(`${err instanceof Error ? err.message : String(err)}\n${USAGE}`);
    return 2;
  }
  const subs = ["add", "list", "remove", "rotate-secret", "enable", "audit", "test", "redeliver"];
  if (!values.config || sub === undefined || !subs.includes(sub)) {
    console.error(USAGE);
    return 2;
  }
  const need = (flag: "principal" | "url" | "events" | "id" | "event"): string | null => {
    const v = values[flag];
    if (v === undefined || v === "") {
      console.error(`webhooks ${sub} needs --${flag}\n${USAGE}`);
      return null;
    }
    return v;
  };
  // Runner tokens play no part here: a runner's token_env need not be set to manage webhooks.
  const env = new Proxy(process.env, {
    get: (target, key) => (typeof key === "string" ? (target[key] ?? "unused-by-webhooks-command") : undefined),
  });
  const config = loadServerConfig(values.config, env);
  const policy = { allowLoopbackHttp: config.webhooks.allowLoopbackHttp };
  // Checked before the state is opened: a refused URL or event name never touches the database.
  let checked: { principal: string; url: string; events: EventType[] } | null = null;
  if (sub === "add") {
    const principal = need("principal");
    const url = need("url");
    const events = need("events");
    if (principal === null || url === null || events === null) return 2;
    if (!config.principals.some((p) => p.id === principal)) {
      console.error(`--principal: no [[principals]] entry "${principal}" in ${config.file}`);
      return 2;
    }
    const names = events.split(",").map((e) => e.trim());
    const unknown = names.filter((e) => !(EVENT_TYPES as readonly string[]).includes(e));
    if (unknown.length > 0 || names.length === 0) {
      console.error(
        `--events: ${unknown.length} unknown event type(s); allowed: ${EVENT_TYPES.join(", ")} (comma-separated)`,
      );
      return 2;
    }
    try {
      await checkDestination(url, policy);
    } catch (err) {
      if (err instanceof DestinationError) {
        console.error(`webhooks add refused: ${err.message}`);
        return 2;
      }
      throw err;
    }
    checked = { principal, url, events: [...new Set(names)] as EventType[] };
  }
  let overlapSecs = SECRET_OVERLAP_SECS;
  if (values["overlap-secs"] !== undefined) {
    const raw = values["overlap-secs"];
    overlapSecs = /^\d+$/.test(raw) ? Number(raw) : Number.NaN;
    if (!(overlapSecs >= 0 && overlapSecs <= MAX_SECRET_OVERLAP_SECS)) {
      console.error(`--overlap-secs: a whole number of seconds from 0 to ${MAX_SECRET_OVERLAP_SECS} (7 days)`);
      return 2;
    }
  }
  const state = await openState(config);
  return await onState(state, { type: SubscriptionLimitError, what: "webhooks add" }, async () => {
    const store = new WebhookSubscriptions(state.engine);
    const outbox = new WebhookOutbox(state.engine);
    switch (sub) {
      case "add": {
        if (checked === null) return 2;
        const secret = newSecret();
        const s = await store.add({
          principal_id: checked.principal,
          url: checked.url,
          event_types: checked.events,
          secret,
        });
        if (values.json) console.log(JSON.stringify({ ...s, secret }));
        else {
          console.error(`added ${s.subscription_id} for ${s.principal_id}: ${s.url} [${s.event_types.join(", ")}]`);
          console.error("the signing secret is shown once; give it to the receiver now:");
          console.log(secret);
        }
        return 0;
      }
      case "list": {
        const listing = await store.list(values.principal);
        const dead = await outbox.events({ status: "dead" }, LIST_DEAD_LETTERS_MAX);
        const shown = new Set(listing.map((s) => s.subscription_id));
        const deadShown = dead.filter((d) => shown.has(d.subscription_id));
        if (values.json) {
          console.log(
            JSON.stringify({
              subscriptions: listing,
              dead_letters: deadShown.map(({ body: _body, ...d }) => d),
            }),
          );
          return 0;
        }
        for (const s of listing) {
          console.log(
            `${s.subscription_id}\t${s.principal_id}\t${s.url}\t${s.event_types.join(",")}\t${s.status}\t` +
              `failures=${s.consecutive_failures}\tpending=${s.pending}\tdelivered=${s.delivered}\tdead=${s.dead}` +
              (s.disabled_at ? `\tdisabled_at=${s.disabled_at}` : "") +
              (s.previous_secret_until_ms !== null && s.previous_secret_until_ms > Date.now()
                ? `\tprevious_secret_until=${new Date(s.previous_secret_until_ms).toISOString()}`
                : "") +
              (s.last_error ? `\tlast_error=${s.last_error}` : ""),
          );
        }
        for (const d of deadShown) {
          console.log(
            `dead\t${d.event_id}\t${d.subscription_id}\t${d.event_type}\t${d.run_id}\tattempts=${d.attempts}` +
              (d.last_error ? `\t${d.last_error}` : ""),
          );
        }
        return 0;
      }
      case "remove": {
        const id = need("id");
        if (id === null) return 2;
        if (!(await store.remove(id))) {
          console.error(`no subscription with id ${id}`);
          return 1;
        }
        console.error(`removed ${id} and its undelivered events`);
        return 0;
      }
      case "rotate-secret": {
        const id = need("id");
        if (id === null) return 2;
        const secret = newSecret();
        const until = Date.now() + overlapSecs * 1000;
        if (!(await store.rotateSecret(id, secret, until))) {
          console.error(`no subscription with id ${id}`);
          return 1;
        }
        if (values.json) console.log(JSON.stringify({ subscription_id: id, secret, previous_secret_until_ms: until }));
        else {
          console.error(
            `rotated ${id}: attempts are signed with the new secret, and with the previous one too until ` +
              `${new Date(until).toISOString()}; the new secret is shown once, give it to the receiver now:`,
          );
          console.log(secret);
        }
        return 0;
      }
      case "enable": {
        const id = need("id");
        if (id === null) return 2;
        if (!(await store.enable(id, Date.now()))) {
          console.error(`no subscription with id ${id}`);
          return 1;
        }
        console.error(`${id} is active; its pending events are due now`);
        return 0;
      }
      case "audit": {
        const rows = await store.auditRows(LIST_AUDIT_MAX, values.id);
        if (values.json) console.log(JSON.stringify({ audit: rows }));
        else
          for (const r of rows) {
            console.log(
              `${r.at}\t${r.event}\t${r.subscription_id}\t${r.principal_id}\t${r.actor}${r.detail ? `\t${r.detail}` : ""}`,
            );
          }
        return 0;
      }
      case "test": {
        const id = need("id");
        if (id === null) return 2;
        const s = await store.get(id);
        if (!s) {
          console.error(`no subscription with id ${id}`);
          return 1;
        }
        const now = Date.now();
        const outcome = await attemptDelivery({
          url: s.url,
          secrets: s.secrets,
          eventId: `msg_ping_${now.toString(36)}`,
          body: pingBody(s.subscription_id, now),
          nowMs: now,
          policy,
        });
        if (outcome.ok) {
          console.error(`ping delivered to ${s.url}: HTTP ${outcome.status}`);
          return 0;
        }
        console.error(`ping not delivered to ${s.url}: ${outcome.error}`);
        return 1;
      }
      case "redeliver": {
        const event = need("event");
        if (event === null) return 2;
        if (!(await outbox.redeliver(event, Date.now()))) {
          console.error(`no dead letter with id ${event}`);
          return 1;
        }
        console.error(`${event} is due again (a fresh retry budget)`);
        return 0;
      }
    }
    return 2;
  });
}
