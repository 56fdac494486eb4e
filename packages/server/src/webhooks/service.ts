/**
 * The webhooks of one Server instance (design §18): `new Webhooks(…)` hooks the outbox writer into the
 * admission records' state changes (StateStore.onStateChange: the events are written inside the transaction
 * that changes the record, so a change and its events commit together or not at all) — construct it before
 * anything can change a record. `onTaskChange` is the managed tasks' listener (tasks/changes.ts), handed to
 * the TaskService the same way. `start()` starts the delivery worker, `close()` stops it.
 */
import type { Logger } from "pino";
import { serverFailpoint } from "../failpoints.js";
import type { StateQueries } from "../state/engine.js";
import type { StateStore } from "../state/store.js";
import type { TaskChange } from "../tasks/changes.js";
import type { DestinationPolicy } from "./destination.js";
import { WebhookOutbox } from "./outbox.js";
import { WebhookSubscriptions } from "./subscriptions.js";
import { DeliveryWorker } from "./worker.js";

export interface WebhookSettings extends DestinationPolicy {
  /** `[server.webhooks] retry_base_ms`: the first retry's delay. */
  retryBaseMs: number;
  /** `[server.webhooks] disable_after_failures`: consecutive failed attempts before a subscription is disabled… */
  disableAfterFailures: number;
  /** …and `disable_after_secs` (as ms): since the first of them, at least. */
  disableAfterMs: number;
}

export class Webhooks {
  readonly subscriptions: WebhookSubscriptions;
  readonly outbox: WebhookOutbox;
  readonly #worker: DeliveryWorker;
  readonly #records: StateStore;
  readonly #log: Logger;

  constructor(records: StateStore, settings: WebhookSettings, log: Logger) {
    this.#records = records;
    this.#log = log;
    this.subscriptions = new WebhookSubscriptions(records.engine);
    this.outbox = new WebhookOutbox(records.engine);
    this.#worker = new DeliveryWorker({
      outbox: this.outbox,
      policy: settings,
      retryBaseMs: settings.retryBaseMs,
      disable: { afterFailures: settings.disableAfterFailures, afterMs: settings.disableAfterMs },
      log,
      beforeAttempt: () => serverFailpoint("webhook_before_attempt"),
    });
    records.onStateChange(async (record, previous, tx) => {
      if ((await this.outbox.enqueue(tx, record, previous, Date.now())) > 0) this.#worker.wake();
    });
  }

  /** Writes a task change's event on `tx`, the transaction of that change (TaskServiceOptions.onChange). */
  readonly onTaskChange = async (change: TaskChange, tx: StateQueries): Promise<void> => {
    if ((await this.outbox.enqueueTask(tx, change, Date.now())) > 0) this.#worker.wake();
  };

  /** Never throws: without the release below, a predecessor's claims are taken again when their leases run out. */
  async start(): Promise<void> {
    // One Server per SQLite state dir: what a killed predecessor left claimed is this instance's to send.
    if (this.#records.engine.dialect === "sqlite") {
      await this.outbox.releaseClaims().catch((err: unknown) => {
        this.#log.warn({ err: (err as Error).message }, "webhook claims of a previous process not released");
      });
    }
    this.#worker.start();
  }

  async close(): Promise<void> {
    await this.#worker.stop();
  }
}
