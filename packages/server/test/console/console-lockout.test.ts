/**
 * Issue 39 §5: the console's wrong-key limits behind a load balancer the operator did not declare in
 * `[server] trusted_proxies` (every request comes from one socket address, 127.0.0.1, with X-Forwarded-For
 * the Server must not believe), against a real Server child process (on PostgreSQL in the PostgreSQL pass).
 *
 * - Wrong keys count per (address, key prefix): ten of them no longer lock every operator out;
 * - the per-address budget over all keys still stops a flood, except for the key prefixes that already
 *   signed in from there;
 * - concurrent wrong tries of one key are counted before their lookup: held together at the lookup (the
 *   `key_lookup` failpoint, test/support/held-race.ts), at most the limit get there and to 401;
 * - the console's log names the untrusted forwarder once, never a key.
 */
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CONSOLE_LOGIN_MAX_FAILURES, CONSOLE_LOGIN_MAX_FAILURES_PER_SOURCE } from "../../src/console/http.js";
import { consoleLogin } from "../support/console-login.js";
import { HOLD_KEY_LOOKUPS, heldRace } from "../support/held-race.js";
import { issueKey } from "../support/oauth.js";
import { ProcStack } from "../support/proc-stack.js";

const UNTRUSTED_LINE = "is not in [server] trusted_proxies";

let stack: ProcStack;
let origin: string;

beforeAll(async () => {
  stack = await new ProcStack({ runners: [], server: "child", extraScopes: ["operator:read"] }).init();
  origin = `http://127.0.0.1:${stack.port}`;
}, 60_000);

afterAll(async () => {
  await stack?.stop();
}, 60_000);

const operatorKey = (who: "alice" | "bob") => issueKey(stack.serverConfigFile, who, ["operator:read"], []);
const madeUpKey = () => `wct_${randomBytes(32).toString("base64url")}`;
/** A key with `key`'s prefix and another tail: an operator's mistyped paste. */
const mistyped = (key: string) =>
  `${key.slice(0, 20)}${randomBytes(32)
    .toString("base64url")
    .slice(0, key.length - 20)}`;
/** Through the load balancer: X-Forwarded-For names the client, but the Server may not believe it. */
const login = (key: string, client = `203.0.113.${1 + Math.floor(Math.random() * 200)}`) =>
  consoleLogin(origin, key, client);
const serverLog = () => stack.serverChild?.output() ?? "";

describe("console wrong-key limits behind an undeclared load balancer", () => {
  it("lets other operators sign in after many wrong keys, stops a mistyped key by its prefix, and names the forwarder once", async () => {
    const alice = await operatorKey("alice");
    const bob = await operatorKey("bob");
    for (let i = 0; i < 3 * CONSOLE_LOGIN_MAX_FAILURES; i++) expect((await login(madeUpKey())).status).toBe(401);
    const bobIn = await login(bob);
    expect(bobIn.status).toBe(303);
    expect(bobIn.cookie).not.toBeNull();

    // Alice keeps pasting a wrong tail of her key: that prefix is stopped, even with the right key now…
    for (let i = 0; i < CONSOLE_LOGIN_MAX_FAILURES; i++) expect((await login(mistyped(alice))).status).toBe(401);
    expect((await login(mistyped(alice))).status).toBe(429);
    expect((await login(alice)).status).toBe(429);
    // …and nobody else is.
    expect((await login(bob)).status).toBe(303);

    const log = serverLog();
    expect(log.split(UNTRUSTED_LINE).length - 1).toBe(1);
    expect(log).toContain('"peer":"127.0.0.1"');
    expect(log).not.toContain(alice.slice(4, 24));
    expect(log).not.toContain(bob.slice(4, 24));
  }, 120_000);

  // Last in this file: it spends the address's budget for the rest of the window.
  it("stops a flood at the per-address budget, except for keys that signed in from there before", async () => {
    const known = await operatorKey("bob");
    expect((await login(known)).status).toBe(303);
    const fresh = await operatorKey("alice");
    let flooded = 0;
    for (; flooded <= CONSOLE_LOGIN_MAX_FAILURES_PER_SOURCE; flooded++) {
      const status = (await login(madeUpKey())).status;
      if (status === 429) break;
      expect(status).toBe(401);
    }
    expect(flooded).toBeLessThanOrEqual(CONSOLE_LOGIN_MAX_FAILURES_PER_SOURCE);
    // A key never used from here waits out the window; one that signed in from here before still may.
    expect((await login(fresh)).status).toBe(429);
    const again = await login(known);
    expect(again.status).toBe(303);
    expect(again.cookie).not.toBeNull();
  }, 180_000);
});

describe("concurrent wrong tries of one key, held together at the lookup", () => {
  let held: ProcStack;

  beforeAll(async () => {
    held = await new ProcStack({ runners: [], server: "child", serverEnv: HOLD_KEY_LOOKUPS }).init();
  }, 60_000);

  afterAll(async () => {
    await held?.stop();
  }, 60_000);

  it("counts each before looking it up: only the limit reach the lookup and 401, the rest are 429", async () => {
    const server = held.serverChild;
    if (server === null) throw new Error("no server child");
    const key = madeUpKey();
    const total = 3 * CONSOLE_LOGIN_MAX_FAILURES;
    // Every try that passes the limit's check waits at the lookup until all have answered or arrived there.
    const { answers, held: atLookup } = await heldRace(server, total, () =>
      consoleLogin(`http://127.0.0.1:${held.port}`, `${key.slice(0, 20)}${madeUpKey().slice(20)}`, "203.0.113.9"),
    );
    expect(atLookup).toBe(CONSOLE_LOGIN_MAX_FAILURES);
    expect(answers.filter((a) => a.status === 401).length).toBe(CONSOLE_LOGIN_MAX_FAILURES);
    expect(answers.filter((a) => a.status === 429).length).toBe(total - CONSOLE_LOGIN_MAX_FAILURES);
  }, 120_000);
});
