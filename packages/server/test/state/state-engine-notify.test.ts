/**
 * Notifications between instances (state/engine.ts `listen`/`notify`, design §14): on a real PostgreSQL, a
 * notify by one engine reaches a listener on another, after the notifier's commit only; a LISTEN connection
 * lost to a database restart is made again by itself and its listener told `null` (resynchronise), then hears
 * again. A bad channel name is refused by field; SQLite's engine takes both calls and does nothing.
 */
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import {
  POSTGRES_START_TIMEOUT_MS,
  type PostgresCluster,
  startPostgresCluster,
} from "../../../../scripts/test-support/postgres.js";
import { MAX_NOTIFICATIONS_PER_STATEMENT, MAX_NOTIFY_PAYLOAD_BYTES, StateUsageError } from "../../src/state/engine.js";
import { openPostgresEngine, type PostgresEngine } from "../../src/state/engine-postgres.js";
import { StateStore } from "../../src/state/store.js";

let cluster: PostgresCluster | undefined;
const opened: PostgresEngine[] = [];

beforeAll(async () => {
  cluster = await startPostgresCluster();
}, POSTGRES_START_TIMEOUT_MS);
afterEach(async () => {
  for (const engine of opened.splice(0)) await engine.close();
});
afterAll(async () => {
  await cluster?.close();
});

async function open(url: string): Promise<PostgresEngine> {
  const engine = await openPostgresEngine({ url });
  opened.push(engine);
  return engine;
}

describe("listen/notify between instances", () => {
  it("carries a notify to another instance's listener, after the notifier's commit only", async () => {
    const url = await cluster!.createDatabase();
    const [a, b] = [await open(url), await open(url)];
    const heard: (string | null)[] = [];
    const stop = await a.listen("webcodex_test", (p) => heard.push(p));
    await b.notify("webcodex_test", "one");
    await poll(() => heard.length === 1, { timeoutMs: IN_PROCESS_WAIT_MS, what: "the first notification" });
    expect(heard).toEqual(["one"]);

    // Inside a transaction: delivered when it commits, never when it rolls back.
    await b
      .transaction(async (tx) => {
        await tx.get("SELECT pg_notify(?, ?) AS n", ["webcodex_test", "rolled-back"]);
        throw new Error("roll back");
      })
      .catch(() => undefined);
    await b.transaction(async (tx) => {
      await tx.get("SELECT pg_notify(?, ?) AS n", ["webcodex_test", "committed"]);
    });
    await poll(() => heard.length === 2, { timeoutMs: IN_PROCESS_WAIT_MS, what: "the committed notification" });
    expect(heard).toEqual(["one", "committed"]);

    // Listeners that stay: once they heard what is sent next, the stopped one had its chance to hear it too.
    const probe: (string | null)[] = [];
    const stopProbe = await a.listen("webcodex_test", (p) => probe.push(p));
    const stopOther = await a.listen("webcodex_other", (p) => probe.push(p));
    stop();
    await b.notify("webcodex_test", "after-stop");
    await b.notify("webcodex_other", "x");
    await poll(() => probe.length === 2, { timeoutMs: IN_PROCESS_WAIT_MS, what: "the probes to hear both" });
    expect(probe).toEqual(["after-stop", "x"]);
    expect(heard).toEqual(["one", "committed"]);
    stopProbe();
    stopOther();

    await expect(a.listen("Bad-Channel; DROP", () => undefined)).rejects.toThrow(StateUsageError);
    await expect(b.notify("webcodex_test", "x".repeat(MAX_NOTIFY_PAYLOAD_BYTES + 1))).rejects.toThrow(
      /MAX_NOTIFY_PAYLOAD_BYTES/,
    );
  });

  it("carries several payloads of one notifyAll, in their order, and refuses what one statement cannot carry", async () => {
    const url = await cluster!.createDatabase();
    const [a, b] = [await open(url), await open(url)];
    const heard: (string | null)[] = [];
    await a.listen("webcodex_test", (p) => heard.push(p));
    const payloads = Array.from({ length: 40 }, (_, i) => `wc_agent_run_${i} r1 holder ${i + 1}`);
    await b.notifyAll("webcodex_test", payloads);
    await b.notifyAll("webcodex_test", ["single"]);
    await b.notifyAll("webcodex_test", []);
    await poll(() => heard.length === 41, { timeoutMs: IN_PROCESS_WAIT_MS, what: "every payload" });
    expect(heard).toEqual([...payloads, "single"]);
    await expect(b.notifyAll("webcodex_test", ["a\nb"])).rejects.toThrow(/line break/);
    await expect(
      b.notifyAll(
        "webcodex_test",
        Array.from({ length: MAX_NOTIFICATIONS_PER_STATEMENT + 1 }, () => "x"),
      ),
    ).rejects.toThrow(/MAX_NOTIFICATIONS_PER_STATEMENT/);
  });

  it(
    "makes a lost LISTEN connection again after a database restart, tells the listener to resync, and hears again",
    async () => {
      const url = await cluster!.createDatabase();
      const [a, b] = [await open(url), await open(url)];
      const heard: (string | null)[] = [];
      await a.listen("webcodex_test", (p) => heard.push(p));
      await cluster!.stop();
      await cluster!.start();
      await poll(() => heard.includes(null), { timeoutMs: 30_000, what: "the resync signal" });
      await b.notify("webcodex_test", "after-restart");
      await poll(() => heard.includes("after-restart"), { timeoutMs: IN_PROCESS_WAIT_MS, what: "a notification" });
    },
    POSTGRES_START_TIMEOUT_MS,
  );

  it("takes listen and notify on SQLite and does nothing (one instance)", async () => {
    const store = new StateStore(mkdtempSync(join(tmpdir(), "wc-notify-")));
    try {
      const heard: (string | null)[] = [];
      const stop = await store.engine.listen("webcodex_test", (p) => heard.push(p));
      await store.engine.notify("webcodex_test", "x");
      await store.engine.notifyAll("webcodex_test", ["x", "y"]);
      stop();
      expect(heard).toEqual([]);
      await expect(store.engine.notify("Bad", "x")).rejects.toThrow(StateUsageError);
      await expect(store.engine.notifyAll("webcodex_test", ["a\nb"])).rejects.toThrow(/line break/);
    } finally {
      await store.close();
    }
  });
});
