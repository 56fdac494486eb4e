/**
 * Issue 19, the impersonation scenario as one chain with real processes: the fake agent, running as the
 * Runner's own user, reads the Runner's token the way a prompt-injected command would (`/proc/<runner>/environ`
 * with `token_env`, or `/proc/<runner>/cmdline` → `--config` → `token_file`) and leaks it to a file; the test
 * starts a second Runner with exactly those bytes. Its hello is refused (`link_in_use`) and audited, and the
 * real Runner keeps receiving the runs: the prompts reach the real agent's ledger, none the impostor's.
 */
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { IMPOSTOR, refusedCount, startImpostor } from "../support/link-impostor.js";
import { ProcStack } from "../support/proc-stack.js";

function ledgerLines(file: string): Record<string, unknown>[] {
  try {
    return readFileSync(file, "utf8")
      .split("\n")
      .filter((l) => l.trim() !== "")
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  } catch {
    return []; // no ledger: that agent never ran
  }
}

describe("an agent that steals its Runner's token cannot take the Runner's link (real processes)", () => {
  let s: ProcStack | undefined;
  afterEach(async () => {
    await s?.stop();
    s = undefined;
  });

  for (const via of ["token_env", "token_file"] as const) {
    it(`the token the agent read through ${via === "token_env" ? "/proc/<runner>/environ" : "cmdline → --config → token_file"} is refused as an impostor and audited; the real Runner keeps receiving runs`, async () => {
      s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }], server: "child" }).init();
      const cfg = join(s.dir, "runner-r1.toml");
      const original = readFileSync(cfg, "utf8");
      if (via === "token_file") {
        const tokenFile = join(s.dir, "runner-r1.token");
        writeFileSync(tokenFile, `${s.tokens.get("r1")}\n`, { mode: 0o600 });
        writeFileSync(
          cfg,
          original.replace('token_env = "WEBCODEX_RUNNER_TOKEN"', `token_file = ${JSON.stringify(tokenFile)}`),
        );
      }
      await s.startRunner("r1");

      const stolenFile = join(s.dir, "stolen");
      const steal =
        via === "token_env"
          ? `scenario: read_credentials env_name=WEBCODEX_RUNNER_TOKEN leak_to=${stolenFile}`
          : `scenario: read_credentials leak_to=${stolenFile}`;
      expect((await s.runToEnd("steal", steal)).state).toBe("completed");
      const creds = ledgerLines(s.ledgerFile("r1")).find((l) => l.event === "credentials");
      expect(creds?.result).toMatchObject(
        via === "token_env"
          ? { environ: { outcome: "read" }, environ_has_name: true, leaked: true }
          : {
              cmdline: { outcome: "read" },
              config: { outcome: "read" },
              token_file: { outcome: "read" },
              leaked: true,
            },
      );
      const stolen = readFileSync(stolenFile, "utf8");
      expect(stolen).toBe(s.tokens.get("r1")); // the agent really got the Runner's credential

      // The impostor: a second Runner with exactly what the agent read, its own store and agent ledger.
      await startImpostor(s, stolen, original);
      await poll(async () => (await refusedCount(s!)) >= 1, {
        timeoutMs: DAEMON_WAIT_MS,
        intervalMs: DAEMON_POLL_MS,
        what: "the impostor refused and audited",
      });
      await poll(() => s?.logs.get(IMPOSTOR)?.includes("link_in_use"), {
        timeoutMs: DAEMON_WAIT_MS,
        intervalMs: DAEMON_POLL_MS,
        what: "the impostor to hear link_in_use",
      });

      for (const key of ["after-1", "after-2"]) {
        expect((await s.runToEnd(key, `scenario: hello ${key}`)).state).toBe("completed");
      }
      const sha = (text: string) => createHash("sha256").update(text, "utf8").digest("hex");
      expect(s.prompts("r1").map((p) => p.prompt_sha256)).toEqual([
        sha(steal),
        sha("scenario: hello after-1"),
        sha("scenario: hello after-2"),
      ]);
      expect(s.prompts(IMPOSTOR)).toEqual([]);
      expect(await refusedCount(s)).toBeGreaterThanOrEqual(1);
    });
  }
});
