/**
 * Issue 19 §2 with real processes: a live Runner link is never silently replaced (design §5). A second
 * `webcodex-runner` holding the real Runner's token is refused and audited while the real one keeps
 * receiving runs; a dropped socket resumes at once with the resume secret; a kill -9'd Runner's
 * replacement gets in within the heartbeat timeout; `runner-token rotate` locks the old token out.
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { afterEach, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll, SERVER_BIN } from "../../../../scripts/test-support/index.js";
import type { StartInput } from "../../src/runs/api.js";
import { IMPOSTOR, linkAudit, refusedCount, startImpostor } from "../support/link-impostor.js";
import { LinkRelay } from "../support/link-relay.js";
import { okValue, ProcStack } from "../support/proc-stack.js";

/** ProcStack's Server heartbeat interval; the link lease runs two of them. */
const HEARTBEAT_MS = 2000;

function input(key: string, prompt = "scenario: hello"): StartInput {
  return { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt };
}

async function auditEvents(s: ProcStack): Promise<string[]> {
  return (await linkAudit(s)).map((r) => r.event);
}

describe("a live Runner link is never silently replaced (real processes)", () => {
  let s: ProcStack | undefined;
  let relay: LinkRelay | undefined;
  afterEach(async () => {
    await relay?.close();
    relay = undefined;
    await s?.stop();
    s = undefined;
  });

  it("refuses and audits an impostor holding the Runner's token while the real Runner keeps receiving the runs", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    await s.startRunner("r1");
    // The impostor: a second Runner with the stolen token, its own store and its own agent ledger.
    await startImpostor(s, s.tokens.get("r1") ?? "");
    await poll(async () => (await refusedCount(s!)) >= 2, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "two refused impostor hellos",
    });

    for (const key of ["a", "b", "c"]) expect((await s.runToEnd(`impostor-${key}`)).state).toBe("completed");
    expect(s.prompts("r1")).toHaveLength(3);
    expect(s.prompts(IMPOSTOR)).toEqual([]);
    expect((await auditEvents(s))[0]).toBe("link_granted");
    expect(await auditEvents(s)).not.toContain("link_resumed");
    expect(s.logs.get(IMPOSTOR)).toContain("link_in_use");
  });

  it("resumes at once after a network blip the Server did not see, with the resume secret", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    relay = await LinkRelay.inFrontOf(s, "r1");
    await s.startRunner("r1");
    const started = okValue(await s.start("alice", input("blip", "scenario: slow interval_ms=100 count=40")));
    await poll(
      async () => {
        const o = okValue(await s!.observe("alice", { run_id: started.run_id }));
        return o.events.length > 0;
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the run to be running" },
    );
    relay.cutRunnerSide();
    await poll(async () => (await auditEvents(s!)).includes("link_resumed"), {
      timeoutMs: 3 * HEARTBEAT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the link resumed",
    });
    // link_resumed, not link_granted: the lease was still live (a resume is decided only then), so the secret
    // did it, not the Server declaring the old link dead.
    expect(await auditEvents(s)).not.toContain("link_refused_in_use");
    expect((await s.untilTerminal(started.run_id)).state).toBe("completed");
    expect(s.prompts("r1")).toHaveLength(1);
  });

  it("lets a kill -9'd Runner's replacement in once the old link is declared dead, within the heartbeat timeout", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    await s.startRunner("r1");
    await s.killRunner("r1", "SIGKILL");
    // Online within startRunner's bound (DAEMON_WAIT_MS): the lease (2 heartbeats) plus the replacement's
    // bounded retry pace; how fast is no test's business on a loaded machine.
    await s.startRunner("r1");
    // Audit rows are written behind the link (LINK_AUDIT_MAX_PENDING): the replacement's may come a moment after.
    const stack = s;
    const events = await poll(
      async () => {
        const now = await auditEvents(stack);
        return now.filter((e) => e === "link_granted").length >= 2 ? now : undefined;
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the replacement's link_granted audit row" },
    );
    expect(events.filter((e) => e === "link_granted")).toHaveLength(2);
    expect(events.at(-1)).toBe("link_granted");
    expect((await s.runToEnd("after-replacement")).state).toBe("completed");
    expect(s.prompts("r1")).toHaveLength(1);
  });

  it("rotate replaces the Runner's token: the live link closes, the old token is refused, the new one works", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    await s.startRunner("r1");
    const oldToken = s.tokens.get("r1") ?? "";
    const { stdout, stderr } = await promisify(execFile)(
      process.execPath,
      [SERVER_BIN, "runner-token", "rotate", "--runner", "r1", "--config", s.serverConfigFile],
      { cwd: s.dir },
    );
    const newToken = stdout.trim();
    expect(newToken).toMatch(/^wcr_[A-Za-z0-9_-]{43}$/);
    expect(stderr).toContain("old token no longer authenticates");
    await s.waitOffline("r1");
    // The audit row is written behind the close (hub.ts #audit): on PostgreSQL it can land after the link is gone.
    await poll(async () => (await auditEvents(s!)).includes("closed_token_rotated"), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the closed_token_rotated audit row",
    });
    await poll(() => s?.logs.get("r1")?.includes("token_revoked"), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the Runner to log the rotation",
    });

    const status = await new Promise<number | null>((resolve) => {
      const ws = new WebSocket(`ws://127.0.0.1:${s?.port}/runner`, {
        headers: { authorization: `Bearer ${oldToken}` },
      });
      ws.on("unexpected-response", (_req, res) => resolve(res.statusCode ?? null));
      ws.on("open", () => {
        ws.terminate();
        resolve(null);
      });
      ws.on("error", () => {});
    });
    expect(status).toBe(401);

    await s.killRunner("r1", "SIGTERM");
    s.tokens.set("r1", newToken);
    await s.startRunner("r1");
    expect((await s.runToEnd("after-rotate")).state).toBe("completed");
    expect(s.prompts("r1")).toHaveLength(1);
  });
});
