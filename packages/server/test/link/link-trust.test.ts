/**
 * Issue 25 §2 with real processes: what the Server knows and does about a Runner whose agents run as its
 * own OS user (they can read its token and kill it), and how a Runner gets its link back after its own crash.
 *
 * - the Runner says in `hello` whether its agents share its user; the Server shows it and, with
 *   `shared_user_principals`, routes only the listed principals' runs to such a Runner;
 * - a `link_in_use` refusal says nothing about when the lease ends;
 * - a kill -9'd Runner with a shared user waits out its old link with one log line on each side;
 * - with `run_as` on every agent (as root: a throwaway OS user), it is back online at once, resuming its link
 *   with the secret it kept in its state dir.
 */
import { chmodSync, chownSync, existsSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { encodeFrame, PROTOCOL_VERSION } from "@webcodex/protocol";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { RESUME_SECRET_FILE } from "../../../runner/src/link/resume.js";
import { agentCopy, createTestUser, IS_ROOT, type TestUser } from "../../../runner/test/support/test-user.js";
import { LINK_IN_USE_MESSAGE } from "../../src/link/hub.js";
import type { StartInput } from "../../src/runs/api.js";
import { FakeRunService } from "../support/fake-run-service.js";
import { linkAudit, refusedCount } from "../support/link-impostor.js";
import { okValue, ProcStack } from "../support/proc-stack.js";

/** The kill -9 tests' Server heartbeat interval: the lease (two of them) is far longer than a restart takes. */
const LONG_HEARTBEAT_MS = 10_000;
/** The Runner's one line while it waits out its old link. */
const WAIT_LINE = "retrying until the Server declares that link dead";

function input(key: string): StartInput {
  return { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt: "scenario: hello" };
}

/** One hello with `token` and no resume secret; resolves with the raw protocol_error frame text it got. */
function refusedHello(port: number, token: string): Promise<string | null> {
  return new Promise((resolve) => {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/runner`, { headers: { authorization: `Bearer ${token}` } });
    let frame: string | null = null;
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
      if (String(data).includes('"protocol_error"')) frame = String(data);
    });
    ws.on("error", () => {});
    ws.on("close", () => resolve(frame));
  });
}

function lines(text: string | undefined, needle: string): string[] {
  return (text ?? "").split("\n").filter((l) => l.includes(needle));
}

describe("a Runner whose agents share its user, and the link (real processes)", () => {
  let s: ProcStack | undefined;
  afterEach(async () => {
    await s?.stop();
    s = undefined;
  });

  it("says so in hello; the Server shows it and starts only the listed principals' runs on it", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"], sharedUserPrincipals: ["alice"] }] }).init();
    await s.startRunner("r1");
    expect((await s.projects("alice"))[0]).toMatchObject({ project_id: "demo", agents_share_runner_user: true });

    const alice = okValue(await s.start("alice", input("shared-alice")));
    expect((await s.untilTerminal(alice.run_id)).state).toBe("completed");
    const bob = await s.start("bob", input("shared-bob"));
    expect(bob).toEqual({
      ok: false,
      error: {
        code: "forbidden",
        recovery_kind: "none",
        message: expect.stringContaining(
          "this Server gives it only the runs of the principals listed in its runners[].shared_user_principals; " +
            "principal bob is not listed. Nothing was started.",
        ),
      },
    });
    // Refused before dispatch: the agent saw alice's prompt only.
    expect(s.prompts("r1")).toHaveLength(1);
  });

  it("refuses a hello on a live link without telling when the lease ends", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }] }).init();
    await s.startRunner("r1");
    const frame = await refusedHello(s.port, s.tokens.get("r1") ?? "");
    expect(frame).not.toBeNull();
    expect(JSON.parse(frame ?? "{}")).toEqual({
      type: "protocol_error",
      code: "link_in_use",
      message: LINK_IN_USE_MESSAGE,
    });
    // No number at all: no seconds, no deadline, no timestamp.
    expect(frame).not.toMatch(/\d/);
  });

  it("a kill -9'd Runner waits out its old link with one log line on each side saying why, and keeps no secret", async () => {
    s = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      serverEnv: { WEBCODEX_LOG_LEVEL: "info" },
      // The restarted Runner must meet the old link's lease: on a loaded machine a restart outlasts two short beats.
      heartbeatIntervalMs: LONG_HEARTBEAT_MS,
    }).init();
    await s.startRunner("r1");
    expect(existsSync(join(s.dir, "runner-state-r1", RESUME_SECRET_FILE))).toBe(false);
    const serverBefore = (s.logs.get("server") ?? "").length;
    await s.killRunner("r1", "SIGKILL");
    await s.startRunner("r1");
    // It was refused more than once while it waited (audit rows are written after the decision, in turn)…
    await poll(async () => (await refusedCount(s!)) >= 2, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the refused hellos audited",
    });
    // …and said so once: the reason on the Runner's side, the possible impersonation on the Server's.
    const runnerLog = s.logs.get("r1");
    expect(lines(runnerLog, WAIT_LINE)).toHaveLength(1);
    expect(lines(runnerLog, WAIT_LINE)[0]).toContain("its agents run as the Runner's user (agents_share_runner_user)");
    expect(lines(runnerLog, "server reported a protocol error")).toHaveLength(0);
    expect(lines(runnerLog, "link closed; reconnecting")).toHaveLength(0);
    const serverLog = (s.logs.get("server") ?? "").slice(serverBefore);
    expect(lines(serverLog, "runner hello refused")).toHaveLength(1);
    // Granted once the lease ran out.
    await s.waitOnline("r1");
    expect((await s.runToEnd("after-wait")).state).toBe("completed");
  });
});

describe.skipIf(!IS_ROOT)("with run_as on every agent (needs root to create a user; CI runs as root)", () => {
  let user: TestUser;
  let agent: ReturnType<typeof agentCopy>;
  let s: ProcStack | undefined;
  beforeAll(() => {
    user = createTestUser("lt");
    agent = agentCopy();
  });
  afterAll(() => {
    user?.remove();
    agent?.remove();
  });
  afterEach(async () => {
    await s?.stop();
    s = undefined;
  });

  /** A stack whose Runner starts the fake agent as the test user, which may write its ledger. */
  async function runAsStack(): Promise<ProcStack> {
    const stack = await new ProcStack({
      runners: [
        {
          id: "r1",
          projects: ["demo"],
          runAs: { user: user.name, agentBin: agent.bin },
          sharedUserPrincipals: ["alice"],
        },
      ],
      heartbeatIntervalMs: LONG_HEARTBEAT_MS,
    }).init();
    chmodSync(stack.dir, 0o711);
    writeFileSync(stack.ledgerFile("r1"), "");
    chownSync(stack.ledgerFile("r1"), user.uid, user.gid);
    return stack;
  }

  it("says its agents do not share its user, so every principal's runs go to it", async () => {
    s = await runAsStack();
    await s.startRunner("r1");
    expect((await s.projects("alice"))[0]).toMatchObject({ agents_share_runner_user: false });
    const bob = okValue(await s.start("bob", input("run-as-bob")));
    expect((await s.untilTerminal(bob.run_id, "bob")).state).toBe("completed");
    expect(s.prompts("r1")).toHaveLength(1);
  });

  it("a kill -9'd Runner is back online at once: it resumes its link with the secret kept in its state dir", async () => {
    s = await runAsStack();
    await s.startRunner("r1");
    const kept = join(s.dir, "runner-state-r1", RESUME_SECRET_FILE);
    // The Runner writes the secret after it reads hello.ack; the Server may report it online a moment before.
    await poll(() => existsSync(kept), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the Runner to keep its resume secret",
    });
    expect(statSync(kept).mode & 0o777).toBe(0o600);

    await s.killRunner("r1", "SIGKILL");
    await s.startRunner("r1");
    // link_resumed below, not link_granted: inside the lease (two 10 s heartbeats; a resume is decided only
    // while it is live), so the secret did it, not a timeout.
    await poll(async () => (await linkAudit(s!)).length >= 2, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the resumed link audited",
    });
    expect((await linkAudit(s)).map((r) => r.event)).toEqual(["link_granted", "link_resumed"]);
    expect(lines(s.logs.get("r1"), WAIT_LINE)).toHaveLength(0);
    expect((await s.runToEnd("after-crash")).state).toBe("completed");
  });
});
