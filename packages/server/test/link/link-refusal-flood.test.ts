/**
 * Issue 19 §2: a flood of refused authenticated hellos (a leaked runner token used over and over while
 * the real Runner holds the link) is bounded in the Server's log and in the link audit. The log says at
 * most REFUSAL_LOG_PER_SECOND lines per runner per second (the rest counted as `suppressed`); the audit
 * keeps one `link_refused_in_use` row per runner per window with the count, so the older evidence — who
 * was granted the link — is never pushed out of the ring. Real Server child process, real Runner, real
 * WebSocket, real SQLite file.
 */

import { encodeFrame, PROTOCOL_VERSION } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { REFUSAL_LOG_PER_SECOND } from "../../src/refusal-log.js";
import { FakeRunService } from "../support/fake-run-service.js";
import { ProcStack } from "../support/proc-stack.js";

/** Hellos in the flood: well past what one log second or one audit row per hello would allow. */
const FLOOD = 120;
/** Hellos in flight at once. */
const PARALLEL = 8;

/** One hello with the stolen token and no resume secret; resolves with the protocol_error code it got. */
function impostorHello(port: number, token: string): Promise<string | null> {
  return new Promise((resolve) => {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/runner`, { headers: { authorization: `Bearer ${token}` } });
    let code: string | null = null;
    ws.on("open", () =>
      ws.send(
        encodeFrame({
          type: "hello",
          protocol_version: PROTOCOL_VERSION,
          ...new FakeRunService().helloBody(),
          inventory: [],
        }),
      ),
    );
    ws.on("message", (data) => {
      const f = JSON.parse(String(data)) as { type: string; code?: string };
      if (f.type === "protocol_error") code = f.code ?? null;
    });
    ws.on("error", () => {});
    ws.on("close", () => resolve(code));
  });
}

describe("a flood of refused hellos is bounded in the log and the link audit (real processes)", () => {
  let s: ProcStack | undefined;
  afterEach(async () => {
    await s?.stop();
    s = undefined;
  });

  it("logs at most the per-second bound and aggregates the refusals into one counted audit row; the granted row and the real Runner stay", async () => {
    s = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      serverEnv: { WEBCODEX_LOG_LEVEL: "info" },
    }).init();
    await s.startRunner("r1");
    const token = s.tokens.get("r1") ?? "";
    const logBefore = s.logs.get("server") ?? "";

    const started = Date.now();
    const codes: (string | null)[] = [];
    for (let i = 0; i < FLOOD; i += PARALLEL) {
      const batch = Array.from({ length: Math.min(PARALLEL, FLOOD - i) }, () => impostorHello(s!.port, token));
      codes.push(...(await Promise.all(batch)));
    }
    const seconds = Math.ceil((Date.now() - started) / 1000);
    expect(codes).toEqual(Array(FLOOD).fill("link_in_use"));

    const stack = s;
    const rows = await poll(
      async () => {
        const all = (
          await stack.stateRows<{ event: string; count: number | string; last_at: string | null }>(
            "SELECT event, count, last_at FROM runner_link_audit ORDER BY id",
          )
        ).map((r) => ({ ...r, count: Number(r.count) }));
        const refused = all.filter((r) => r.event === "link_refused_in_use");
        return refused.reduce((n, r) => n + r.count, 0) === FLOOD ? all : undefined;
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the refusals counted" },
    );
    expect(rows[0]).toMatchObject({ event: "link_granted", count: 1 });
    // One window (60 s) unless the flood itself straddled more; never one row per hello.
    const refusedRows = rows.filter((r) => r.event === "link_refused_in_use");
    expect(refusedRows.length).toBeLessThanOrEqual(Math.ceil(seconds / 60) + 1);
    expect(refusedRows[0]?.last_at).not.toBeNull();

    const flood = (s.logs.get("server") ?? "").slice(logBefore.length).split("\n");
    const refusedLines = flood.filter((l) => l.includes("runner hello refused"));
    expect(refusedLines.length).toBeGreaterThan(0);
    expect(refusedLines.length).toBeLessThanOrEqual(REFUSAL_LOG_PER_SECOND * (seconds + 1));
    // Nothing else about the refused connections is logged per hello either.
    expect(flood.filter((l) => l.includes("runner_id")).length).toBeLessThanOrEqual(
      REFUSAL_LOG_PER_SECOND * (seconds + 1) + 4,
    );

    // The real Runner held its link throughout.
    expect((await s.runToEnd("after-flood")).state).toBe("completed");
    expect(s.prompts("r1")).toHaveLength(1);
  });
});
