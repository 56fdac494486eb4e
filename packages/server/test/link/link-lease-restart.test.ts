/**
 * Issue 19 §2, the restart gap: link leases are written down in the state DB, so a Server restart
 * (kill -9 or SIGTERM) does not hand the link to the first hello carrying the token. An impostor with
 * the real Runner's token that connects right after the restart — before the real Runner can — is
 * refused (`link_in_use`) and audited; the real Runner resumes with the secret it kept in memory and
 * keeps receiving the runs. Real Server child process, real Runners, real SQLite file.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { IMPOSTOR, linkAudit, startImpostor } from "../support/link-impostor.js";
import { LinkRelay } from "../support/link-relay.js";
import { ProcStack } from "../support/proc-stack.js";

/** Long enough that the lease (two intervals) cannot run out while the Server restarts on a slow machine. */
const HEARTBEAT_MS = 30_000;

describe("link leases survive a Server restart (real processes)", () => {
  let s: ProcStack | undefined;
  let relay: LinkRelay | undefined;
  afterEach(async () => {
    await relay?.close();
    relay = undefined;
    await s?.stop();
    s = undefined;
  });

  for (const signal of ["SIGKILL", "SIGTERM"] as const) {
    it(`after a ${signal} Server restart an impostor with the token is refused and audited; the real Runner resumes and keeps receiving runs`, async () => {
      s = await new ProcStack({
        runners: [{ id: "r1", projects: ["demo"] }],
        server: "child",
        heartbeatIntervalMs: HEARTBEAT_MS,
      }).init();
      // The impostor talks to the Server directly; the real Runner goes through a relay the test can gate.
      const original = readFileSync(join(s.dir, "runner-r1.toml"), "utf8");
      relay = await LinkRelay.inFrontOf(s, "r1");
      await s.startRunner("r1");
      expect((await s.runToEnd("before-restart")).state).toBe("completed");

      // The real Runner cannot reach the restarted Server until the impostor has tried.
      relay.gated = true;
      await s.killServer(signal);
      await s.startServer();
      await startImpostor(s, s.tokens.get("r1") ?? "", original);
      await poll(async () => (await linkAudit(s!)).some((r) => r.event === "link_refused_in_use"), {
        timeoutMs: DAEMON_WAIT_MS,
        intervalMs: DAEMON_POLL_MS,
        what: "the impostor refused after the restart",
      });
      expect((await linkAudit(s)).map((r) => r.event)).toEqual(["link_granted", "link_refused_in_use"]);
      await poll(() => s?.logs.get(IMPOSTOR)?.includes("link_in_use"), {
        timeoutMs: DAEMON_WAIT_MS,
        intervalMs: DAEMON_POLL_MS,
        what: "the impostor to hear link_in_use",
      });

      relay.release();
      await poll(async () => (await linkAudit(s!)).some((r) => r.event === "link_resumed"), {
        timeoutMs: DAEMON_WAIT_MS,
        intervalMs: DAEMON_POLL_MS,
        what: "the real Runner to resume",
      });
      for (const key of ["after-1", "after-2"]) expect((await s.runToEnd(key)).state).toBe("completed");
      expect(s.prompts("r1")).toHaveLength(3);
      expect(s.prompts(IMPOSTOR)).toHaveLength(0);
      expect((await linkAudit(s)).filter((r) => r.event === "link_granted")).toHaveLength(1);
    });
  }
});
