/**
 * Each run_as pool user's own HOME (issue 39 §1, design §4.2), with the real Runner, real OS users and the
 * fake agent: setpriv sets no HOME, so the Runner sets the child's HOME (and USER, LOGNAME) to the run's
 * pool user's passwd entry; two callers' runs get different HOMEs, and what one caller's run writes to its
 * HOME the other caller's run cannot read. A HOME mapped in env_from_env (one HOME for every pool user, the
 * old recipe) is refused at config load.
 *
 * Needs root (CI runs as root) to create users and switch to them; skipped otherwise, as tenancy.test.ts.
 */

import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, chownSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { type LedgerLine, readLedger } from "../../../../scripts/test-support/index.js";
import { probeVerdict } from "../../src/commands/probe-verdict.js";
import { ConfigError, parseConfig, type RunnerConfig } from "../../src/config/config.js";
import { FilePoolBindings } from "../../src/process/user-bindings.js";
import { newManager, runToEnd } from "../support/harness.js";
import {
  agentCopy,
  createTestUser,
  IS_ROOT,
  pooledRunnerHead,
  removePoolFixture,
  sharedTestDir,
  type TestUser,
} from "../support/test-user.js";

const T_ALICE = "tn_aaaaaaaaaaaaaaaaaaaaaaaaaa";
const T_BOB = "tn_bbbbbbbbbbbbbbbbbbbbbbbbbb";

interface Ctx {
  users: [TestUser, TestUser];
  agent: ReturnType<typeof agentCopy>;
  dir: string;
  homes: string;
  ledger: string;
  configText: (pool: readonly string[], env?: string) => string;
  config: RunnerConfig;
}
let ctx: Ctx;

const canary = () => randomBytes(24).toString("hex");

/** Config load's refusals of `text`, or [] when it loads. */
function refusals(text: string): string[] {
  try {
    parseConfig(text, join(ctx.dir, "runner.toml"));
    return [];
  } catch (error) {
    if (error instanceof ConfigError) return [...error.errors];
    throw error;
  }
}

describe.skipIf(!IS_ROOT)(
  "each run_as pool user's own HOME (needs root to create users and switch to them)",
  { timeout: 120_000 },
  () => {
    beforeAll(() => {
      const users: [TestUser, TestUser] = [createTestUser("h1"), createTestUser("h2")];
      const agent = agentCopy();
      // Not in /tmp: every run_as agent gets its own, empty one (process/sandbox.ts).
      const dir = sharedTestDir("wc-home-env-");
      const homes = join(dir, "homes");
      mkdirSync(homes, { mode: 0o755 });
      for (const u of users) {
        const home = join(homes, u.name);
        execFileSync("usermod", ["-d", home, u.name]);
        mkdirSync(home, { mode: 0o700 });
        chownSync(home, u.uid, u.gid);
      }
      const project = join(dir, "project");
      mkdirSync(project, { mode: 0o755 });
      const ledger = join(dir, "ledger.jsonl");
      writeFileSync(ledger, "");
      chmodSync(ledger, 0o666);
      const configText = (pool: readonly string[], env = "") =>
        [
          ...pooledRunnerHead(dir, project),
          "[[acp.agents]]",
          'id = "pooled"',
          `executable = ${JSON.stringify(agent.bin)}`,
          `args = ${JSON.stringify(["--ledger", ledger])}`,
          `run_as = ${JSON.stringify(pool)}`,
          "[acp.agents.env_from_env]",
          'PATH = "PATH"',
          env,
        ].join("\n");
      const text = configText(users.map((u) => u.name));
      ctx = { users, agent, dir, homes, ledger, configText, config: parseConfig(text, join(dir, "runner.toml")) };
    });

    afterAll(async () => {
      if (!ctx) return;

      // Nothing of the test users may be left running; whatever is (a failed test) dies before they go.

      expect(await removePoolFixture(ctx)).toEqual([]);
    });

    test("a pooled agent's HOME, USER and LOGNAME are its own user's; a file one caller's run writes to $HOME is not the other caller's to read", async () => {
      const stateDir = mkdtempSync(join(tmpdir(), "wc-home-env-bindings-"));
      const { manager } = newManager(ctx.config, { poolBindings: new FilePoolBindings(stateDir) });
      try {
        const probe = async (tenant: string, prompt: string): Promise<LedgerLine> => {
          const before = readLedger(ctx.ledger).length;
          const { run } = await runToEnd(manager, prompt, { provider_id: "pooled", tenant });
          expect(run.state).toBe("completed");
          const line = readLedger(ctx.ledger)
            .slice(before)
            .find((l) => l.event === "home_probed");
          expect(line, prompt).toBeDefined();
          return line!;
        };
        const tag = canary();
        const alice = await probe(T_ALICE, `scenario: home_probe tag=${tag} write=true`);
        const aliceUser = ctx.users.find((u) => u.uid === alice.uid)!;
        expect(aliceUser).toBeDefined();
        const aliceHome = join(ctx.homes, aliceUser.name);
        expect(alice.env).toEqual({ HOME: aliceHome, USER: aliceUser.name, LOGNAME: aliceUser.name });
        expect(alice).toMatchObject({ wrote: "written", own: "canary" });

        // Bob's run: another pool user, another HOME; neither its own HOME nor alice's file shows the canary.
        const bob = await probe(T_BOB, `scenario: home_probe tag=${tag} read=${join(aliceHome, `wc-home-${tag}`)}`);
        const bobUser = ctx.users.find((u) => u.uid === bob.uid)!;
        expect(bobUser).toBeDefined();
        expect(bobUser.uid).not.toBe(aliceUser.uid);
        expect(bob.env).toEqual({ HOME: join(ctx.homes, bobUser.name), USER: bobUser.name, LOGNAME: bobUser.name });
        expect(bob.own).toBe("ENOENT");
        expect(bob.other).toBe("EACCES");

        // Alice's next run (her own pool user) still finds what she left.
        const again = await probe(T_ALICE, `scenario: home_probe tag=${tag}`);
        expect(again).toMatchObject({ uid: aliceUser.uid, own: "canary" });
      } finally {
        await manager.close();
        rmSync(stateDir, { recursive: true, force: true });
      }
    });

    test("the pool user's HOME path never reaches the run's events (redacted as a mapped HOME was)", async () => {
      const stateDir = mkdtempSync(join(tmpdir(), "wc-home-env-bindings-"));
      const { manager } = newManager(ctx.config, { poolBindings: new FilePoolBindings(stateDir) });
      try {
        const { run, events } = await runToEnd(manager, "scenario: echo_env name=HOME", {
          provider_id: "pooled",
          tenant: T_ALICE,
        });
        expect(run.state).toBe("completed");
        const text = JSON.stringify(events);
        expect(text).toContain("value of HOME:");
        expect(text).not.toContain("(unset)");
        for (const u of ctx.users) expect(text).not.toContain(join(ctx.homes, u.name));
      } finally {
        await manager.close();
        rmSync(stateDir, { recursive: true, force: true });
      }
    });

    test("check --probe's verdict does not ask a run_as agent to map HOME (the Runner sets it)", () => {
      const pooled = ctx.config.acp.agents[0]!;
      const verdict = (agent: typeof pooled) =>
        probeVerdict({
          agent,
          initialize: { protocolVersion: 1 },
          session: { sessionId: "s" },
          forced: { ok: true, effective: [] },
        }).warnings.filter((w) => w.includes("HOME"));
      expect(verdict(pooled)).toEqual([]);
      // Without run_as the agent runs with what env_from_env maps, and the warning stays.
      expect(verdict({ ...pooled, runAs: null })).toEqual([expect.stringContaining("env: HOME not mapped")]);
    });

    test("env_from_env.HOME on a run_as agent is refused at load, naming the key, why and what to do", () => {
      const names = ctx.users.map((u) => u.name);
      const file = join(ctx.dir, "runner.toml");
      const pooled = refusals(ctx.configText(names, 'HOME = "WEBCODEX_AGENT_HOME"'));
      expect(pooled).toHaveLength(1);
      expect(pooled[0]).toBe(
        `${file}: acp.agents[0].env_from_env.HOME: maps one HOME for every user of this run_as pool (2 users): ` +
          "what one caller's run leaves there (agent logins, shell rc files, caches, ~/.gitconfig) is read by every " +
          "other caller's runs; remove it: the Runner sets each pool user's HOME to the user's own (its passwd " +
          "entry, checked owner-only at start and wiped when the user is recycled); put agent logins in " +
          "[acp] home_template",
      );
      // A pool of one is refused too (one rule for every run_as agent), with its own reason.
      const single = refusals(ctx.configText([names[0]!], 'HOME = "WEBCODEX_AGENT_HOME"'));
      expect(single).toHaveLength(1);
      expect(single[0]).toContain(`${file}: acp.agents[0].env_from_env.HOME: is not allowed on a run_as agent`);
      expect(single[0]).toContain("[acp] home_template");
      // Without the mapping both load.
      expect(refusals(ctx.configText([names[0]!]))).toEqual([]);
    });
  },
);
