/**
 * The run summary's `usage` (issue 44 item 3): the normalizer keeps the latest ACP `usage_update` as numbers
 * and an ISO 4217 code, out-of-bound numbers and any other currency text become null, and what it keeps
 * always passes the protocol's RunUsage schema (a summary that failed it would be dropped from the link).
 */
import type { SessionUpdate } from "@agentclientprotocol/sdk";
import { MAX_USAGE_COST_AMOUNT, MAX_USAGE_TOKENS, RunUsage } from "@webcodex/protocol";
import { describe, expect, it } from "vitest";
import { EventNormalizer } from "../../src/events/normalize.js";
import { Redactor } from "../../src/events/redactor.js";

function normalizer() {
  return new EventNormalizer({ projectRoot: "/work/p", redactor: new Redactor([], "/work/p"), emit: () => undefined });
}

const update = (u: Record<string, unknown>) => ({ sessionUpdate: "usage_update", ...u }) as unknown as SessionUpdate;

describe("the run summary's usage", () => {
  it("is null until a usage_update, then the latest one", () => {
    const n = normalizer();
    expect(n.usage).toBeNull();
    n.handle(update({ used: 10, size: 100 }));
    n.handle(update({ used: 1234, size: 200000, cost: { amount: 0.0042, currency: "USD" } }));
    expect(n.usage).toEqual({ used_tokens: 1234, context_size: 200000, cost_amount: 0.0042, cost_currency: "USD" });
    expect(RunUsage.safeParse(n.usage).success).toBe(true);
  });

  it("drops out-of-bound numbers and non-code currencies to null, and always fits RunUsage", () => {
    const n = normalizer();
    const text = "a canary 5d0f3c2a9b8e7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c6";
    n.handle(
      update({ used: MAX_USAGE_TOKENS + 1, size: -1, cost: { amount: MAX_USAGE_COST_AMOUNT * 2, currency: text } }),
    );
    expect(n.usage).toEqual({ used_tokens: null, context_size: null, cost_amount: null, cost_currency: null });
    n.handle(update({ used: 1.5, size: 100, cost: { amount: 3, currency: text } }));
    expect(n.usage).toEqual({ used_tokens: null, context_size: 100, cost_amount: 3, cost_currency: null });
    expect(RunUsage.safeParse(n.usage).success).toBe(true);
    expect(JSON.stringify(n.usage)).not.toContain("canary");
  });
});
