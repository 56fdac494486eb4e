/**
 * Pools one caller cannot exhaust (issue 39 §3, design §4.2) and pool users' HOMEs (§1), with the real
 * Runner, real OS users and the fake agent: a caller holds at most `max_users_per_caller` users of a pool,
 * a user its caller left idle for `binding_idle_days` is recycled for another caller (swept, HOME wiped
 * without following symlinks and re-created from `home_template`), and `check` refuses HOMEs others can
 * read and a project root a group of pool users may write off the documented recipe.
 *
 * Needs root (CI runs as root) to create users and switch to them; skipped otherwise, as tenancy.test.ts.
 */

import { execFile, execFileSync, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  chmodSync,
  chownSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { CAPACITY_REASONS } from "@webcodex/protocol";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { alive, poll, RUNNER_BIN, readLedger } from "../../../../scripts/test-support/index.js";
import { parseConfig, type RunnerConfig } from "../../src/config/config.js";
import { findSystemTool } from "../../src/config/run-as.js";
import { homeGuard, oddHome, PoolHomeError, poolHomeRefusals, recycleHome } from "../../src/process/pool-homes.js";
import { listUidProcesses } from "../../src/process/proc-identity.js";
import { FilePoolBindings } from "../../src/process/user-bindings.js";
import { endHangingRun, newManager, runToEnd, startRequest, waitForState } from "../support/harness.js";
import {
  agentCopy,
  createTestUser,
  IS_ROOT,
  pooledRunnerHead,
  removePoolFixture,
  sharedTestDir,
  type TestUser,
} from "../support/test-user.js";

const execFileP = promisify(execFile);
const SETPRIV = findSystemTool("setpriv") ?? "setpriv";
const DAY_MS = 24 * 60 * 60 * 1000;
/** Each cleanup step's grace where a run has ended and its agent is still being stopped (see its test). */
const ENDING_GRACE_MS = 5_000;
/** A run that lives until cancelled (60 s at most). */
const SLOW = "scenario: slow interval_ms=100 count=600";

const T_ALICE = "tn_aaaaaaaaaaaaaaaaaaaaaaaaaa";
const T_BOB = "tn_bbbbbbbbbbbbbbbbbbbbbbbbbb";
const T_CAROL = "tn_cccccccccccccccccccccccccc";
const T_DAVE = "tn_dddddddddddddddddddddddddd";

interface Ctx {
  users: [TestUser, TestUser, TestUser];
  agent: ReturnType<typeof agentCopy>;
  dir: string;
  homes: string;
  template: string;
  project: string;
  ledger: string;
  configText: (extra?: string) => string;
  configFile: string;
  config: RunnerConfig;
}
let ctx: Ctx;

function homeOf(u: TestUser): string {
  return join(ctx.homes, u.name);
}

/** Run `webcodex-runner check` on `text`; never throws on a non-zero exit. */
async function check(text: string): Promise<{ code: number; stdout: string; stderr: string }> {
  const file = join(ctx.dir, `check-${randomBytes(4).toString("hex")}.toml`);
  writeFileSync(file, `${text}\n`, { mode: 0o600 });
  try {
    const { stdout, stderr } = await execFileP(process.execPath, [RUNNER_BIN, "check", "--config", file]);
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  } finally {
    rmSync(file, { force: true });
  }
}

function captureLogs() {
  const lines: Record<string, unknown>[] = [];
  const logger = pino({ level: "info" }, { write: (line: string) => lines.push(JSON.parse(line)) });
  return { logger, lines };
}

describe.skipIf(!IS_ROOT)(
  "fair run_as pools (needs root to create users and switch to them)",
  { timeout: 120_000 },
  () => {
    beforeAll(() => {
      const users: [TestUser, TestUser, TestUser] = [createTestUser("f1"), createTestUser("f2"), createTestUser("f3")];
      const agent = agentCopy();
      // Not in /tmp: every run_as agent gets its own, empty one (process/sandbox.ts).
      const dir = sharedTestDir("wc-fair-");
      const homes = join(dir, "homes");
      mkdirSync(homes, { mode: 0o755 });
      for (const u of users) {
        const home = join(homes, u.name);
        execFileSync("usermod", ["-d", home, u.name]);
        mkdirSync(home, { mode: 0o700 });
        chownSync(home, u.uid, u.gid);
      }
      const template = join(dir, "home-template");
      mkdirSync(join(template, ".agent"), { recursive: true });
      writeFileSync(join(template, ".agent", "login.json"), '{"login":"template"}\n', { mode: 0o600 });
      writeFileSync(join(template, ".profile"), "# from the template\n", { mode: 0o644 });
      const project = join(dir, "project");
      mkdirSync(project, { mode: 0o755 });
      const ledger = join(dir, "ledger.jsonl");
      writeFileSync(ledger, "");
      chmodSync(ledger, 0o666);
      const configText = (extra = "") =>
        [
          ...pooledRunnerHead(dir, project),
          `home_template = ${JSON.stringify(template)}`,
          "[[acp.agents]]",
          'id = "pooled"',
          `executable = ${JSON.stringify(agent.bin)}`,
          `args = ${JSON.stringify(["--ledger", ledger])}`,
          `run_as = ${JSON.stringify(users.map((u) => u.name))}`,
          extra,
          "[acp.agents.env_from_env]",
          'PATH = "PATH"',
        ].join("\n");
      const configFile = join(dir, "runner.toml");
      writeFileSync(configFile, `${configText()}\n`, { mode: 0o600 });
      ctx = {
        users,
        agent,
        dir,
        homes,
        template,
        project,
        ledger,
        configText,
        configFile,
        config: parseConfig(configText(), configFile),
      };
    });

    afterAll(async () => {
      if (!ctx) return;

      // Nothing of the test users may be left running; whatever is (a failed test) dies before they go.

      expect(await removePoolFixture(ctx)).toEqual([]);
    });

    test("alice starts 3 runs at once on a pool of 3: she gets max_users_per_caller (half the pool: 1), bob and carol still get a user", async () => {
      const stateDir = mkdtempSync(join(tmpdir(), "wc-fair-bindings-"));
      const { manager } = newManager(ctx.config, { poolBindings: new FilePoolBindings(stateDir) });
      const started: string[] = [];
      try {
        await manager.usersReady;
        const alice = [1, 2, 3].map(() => startRequest(manager, SLOW, { provider_id: "pooled", tenant: T_ALICE }));
        const answers = await Promise.all(alice.map((r) => manager.start(r)));
        const admitted = answers.filter((a) => a.ok);
        expect(admitted).toHaveLength(1);
        for (const [i, a] of answers.entries()) if (a.ok) started.push(alice[i]?.run_id as string);
        expect(answers.filter((a) => !a.ok)).toEqual([
          {
            ok: false,
            code: "capacity",
            capacity_reason: "caller_limit",
            message: CAPACITY_REASONS.caller_limit.summary,
          },
          {
            ok: false,
            code: "capacity",
            capacity_reason: "caller_limit",
            message: CAPACITY_REASONS.caller_limit.summary,
          },
        ]);
        for (const [tenant, i] of [
          [T_BOB, 1],
          [T_CAROL, 2],
        ] as const) {
          const req = startRequest(manager, SLOW, { provider_id: "pooled", tenant });
          expect(await manager.start(req)).toMatchObject({ ok: true });
          started.push(req.run_id);
          await waitForState(manager, req.run_id, "running");
          expect(new FilePoolBindings(stateDir).load().get(ctx.users[i].uid)?.tenant).toBe(tenant);
        }
        // Every user serves a live run now: a fourth caller is told the pool is busy (retrying helps).
        expect(
          await manager.start(startRequest(manager, "scenario: hello", { provider_id: "pooled", tenant: T_DAVE })),
        ).toMatchObject({ ok: false, code: "capacity", capacity_reason: "pool_busy" });
      } finally {
        for (const id of started) await manager.cancel(id);
        for (const id of started) await manager.whenSettled(id);
        await manager.close();
        rmSync(stateDir, { recursive: true, force: true });
      }
    });

    test("a caller's next start waits for her user to be released by her run that has ended, instead of caller_limit", async () => {
      const stateDir = mkdtempSync(join(tmpdir(), "wc-fair-ending-"));
      // Each cleanup step's grace: the ended run surely still holds her user when her next start comes.
      const { manager } = newManager(ctx.config, {
        poolBindings: new FilePoolBindings(stateDir),
        cleanupGraceMs: ENDING_GRACE_MS,
      });
      const started: string[] = [];
      try {
        await manager.usersReady;
        // Her one user (max_users_per_caller is half the pool: 1) serves a run that ends held by its agent.
        const first = startRequest(manager, "scenario: hang", { provider_id: "pooled", tenant: T_ALICE });
        expect(await manager.start(first)).toMatchObject({ ok: true });
        started.push(first.run_id);
        const settled = await endHangingRun(manager, first.run_id);
        expect(settled(), "her ended run still holds her user").toBe(false);

        const next = startRequest(manager, "scenario: hello", { provider_id: "pooled", tenant: T_ALICE });
        expect(await manager.start(next)).toMatchObject({ ok: true, created: true });
        started.push(next.run_id);
        expect(settled(), "her user was freed by the ended run settling").toBe(true);
        await manager.whenSettled(next.run_id);
        expect(manager.sync(next.run_id, 0, 0)?.run.state).toBe("completed");
      } finally {
        for (const id of started) await manager.cancel(id);
        for (const id of started) await manager.whenSettled(id);
        await manager.close();
        rmSync(stateDir, { recursive: true, force: true });
      }
    });

    test("a user idle for binding_idle_days is recycled for a new caller: swept, HOME wiped (symlinks not followed) and re-created from home_template", async () => {
      const [u1, u2, u3] = ctx.users;
      const stateDir = mkdtempSync(join(tmpdir(), "wc-fair-recycle-"));
      const bindings = new FilePoolBindings(stateDir);
      const now = Date.now();
      const at = (daysAgo: number) => new Date(now - daysAgo * DAY_MS).toISOString();
      const bind = (u: TestUser, tenant: string, daysAgo: number) =>
        bindings.bind({ uid: u.uid, user: u.name, tenant, bound_at: at(daysAgo + 1), last_used_at: at(daysAgo) });
      bind(u1, T_ALICE, 29);
      bind(u2, T_BOB, 1);
      bind(u3, T_CAROL, 0);
      // What alice's runs left in u1's HOME, a symlink out of it, and a process of u1 still running.
      const home = homeOf(u1);
      const note = `note-canary-${randomBytes(24).toString("hex")}`;
      mkdirSync(join(home, "deep", "er"), { recursive: true });
      writeFileSync(join(home, ".bashrc"), `echo ${note}\n`);
      writeFileSync(join(home, "deep", "er", "notes.txt"), note);
      const outside = mkdtempSync(join(tmpdir(), "wc-fair-outside-"));
      writeFileSync(join(outside, "keep.txt"), "kept");
      symlinkSync(outside, join(home, "escape"));
      execFileSync("chown", ["-R", "-h", `${u1.uid}:${u1.gid}`, home]);
      const sleeper = spawn(
        SETPRIV,
        [`--reuid=${u1.uid}`, `--regid=${u1.gid}`, "--clear-groups", "--", "sleep", "600"],
        {
          detached: true,
          stdio: "ignore",
        },
      );
      sleeper.unref();
      const sleeperPid = sleeper.pid as number;
      await poll(() => listUidProcesses(new Set([u1.uid])).some((p) => p.pid === sleeperPid), {
        timeoutMs: 10_000,
        what: "the sleeper as u1",
      });

      const { logger, lines } = captureLogs();
      try {
        // 29 days idle, under the default 30: nothing to recycle, and retrying will not help.
        const early = newManager(ctx.config, { poolBindings: new FilePoolBindings(stateDir), logger }).manager;
        try {
          await early.usersReady;
          const refused = await early.start(
            startRequest(early, "scenario: hello", { provider_id: "pooled", tenant: T_DAVE }),
          );
          expect(refused).toMatchObject({ ok: false, code: "capacity", capacity_reason: "pool_bound" });
          expect(existsSync(join(home, ".bashrc"))).toBe(true);
        } finally {
          await early.close();
        }

        // 31 days idle: dave's start recycles u1 and runs as it.
        bind(u1, T_ALICE, 31);
        const { manager } = newManager(ctx.config, { poolBindings: new FilePoolBindings(stateDir), logger });
        try {
          await manager.usersReady;
          // The start-up sweep killed the first sleeper; this one, started after it, only the recycle's sweep kills.
          const sleeper2 = spawn(
            SETPRIV,
            [`--reuid=${u1.uid}`, `--regid=${u1.gid}`, "--clear-groups", "--", "sleep", "600"],
            { detached: true, stdio: "ignore" },
          );
          sleeper2.unref();
          const pid2 = sleeper2.pid as number;
          await poll(() => alive(pid2), { timeoutMs: 10_000, what: "the second sleeper" });
          const before = readLedger(ctx.ledger).length;
          const { run } = await runToEnd(manager, "scenario: leftovers", { provider_id: "pooled", tenant: T_DAVE });
          expect(run.state).toBe("completed");
          // The run is u1's, and nothing of u1 was left running for it (the recycle swept the sleeper).
          expect(
            readLedger(ctx.ledger)
              .slice(before)
              .find((l) => l.event === "leftovers"),
          ).toMatchObject({
            uid: u1.uid,
            count: 0,
          });
          expect(alive(pid2)).toBe(false);
        } finally {
          await manager.close();
        }
        expect(alive(sleeperPid)).toBe(false);
        // The HOME holds the template only, owned by u1, owner-only; what was outside the symlink is untouched.
        expect(readdirSync(home).sort()).toEqual([".agent", ".profile"]);
        expect(readFileSync(join(home, ".agent", "login.json"), "utf8")).toBe('{"login":"template"}\n');
        for (const p of [home, join(home, ".agent"), join(home, ".agent", "login.json"), join(home, ".profile")]) {
          const st = lstatSync(p);
          expect([st.uid, st.gid, st.mode & 0o077]).toEqual([u1.uid, u1.gid, 0]);
        }
        expect(statSync(home).mode & 0o777).toBe(0o700);
        expect(readFileSync(join(outside, "keep.txt"), "utf8")).toBe("kept");
        // Bound anew to dave, durably; bob's and carol's untouched.
        const kept = new FilePoolBindings(stateDir).load();
        expect([kept.get(u1.uid)?.tenant, kept.get(u2.uid)?.tenant, kept.get(u3.uid)?.tenant]).toEqual([
          T_DAVE,
          T_BOB,
          T_CAROL,
        ]);
        // Audited in the log with the user only: no tenant tag, no file name or content from the HOME.
        const recycled = lines.find((l) => String(l.msg).includes("was recycled"));
        expect(recycled).toMatchObject({ user: u1.name, uid: u1.uid, removed: 5, copied: 3 });
        const text = JSON.stringify(lines);
        for (const secret of [note, T_ALICE, T_DAVE, "notes.txt", ".bashrc"]) expect(text).not.toContain(secret);
      } finally {
        rmSync(stateDir, { recursive: true, force: true });
        rmSync(outside, { recursive: true, force: true });
      }
    });

    test("a HOME that is a project root, the state dir, / or a symlink is never wiped", async () => {
      const guard = homeGuard(ctx.config);
      const pooled = ctx.config.acp.agents[0]?.runAs?.users[0];
      if (!pooled) throw new Error("no pool user");
      // Only ever judged, never handed to recycleHome: a regression must not be able to wipe them.
      for (const odd of ["/", "/etc/wc-home", ctx.config.runner.stateDir, join(ctx.project, "sub"), ctx.homes]) {
        expect(oddHome({ uid: pooled.uid, home: odd }, guard), odd).not.toBeNull();
      }
      // Test-owned temp trees only: the project root, and a HOME that is a symlink to it.
      const canary = join(ctx.project, `canary-${randomBytes(8).toString("hex")}`);
      writeFileSync(canary, "x");
      const link = join(ctx.dir, "link-home");
      symlinkSync(ctx.project, link);
      try {
        for (const home of [ctx.project, link]) {
          await expect(recycleHome({ ...pooled, home }, guard)).rejects.toThrow(PoolHomeError);
        }
        expect(existsSync(canary)).toBe(true);
      } finally {
        rmSync(canary, { force: true });
        rmSync(link, { force: true });
      }
    });

    test("check and start refuse a pool user's HOME others can read, naming the user and the chmod", async () => {
      const [, u2] = ctx.users;
      const home = homeOf(u2);
      chmodSync(home, 0o755);
      try {
        const refused = await check(ctx.configText());
        expect(refused.code).toBe(2);
        expect(refused.stderr).toContain(`run_as user ${u2.name}: its HOME ${home} has mode 0755`);
        expect(refused.stderr).toContain(`chmod 700 ${home}`);
        // `run` refuses the same config before it connects anywhere, with the same words.
        const file = join(ctx.dir, "run-refused.toml");
        writeFileSync(
          file,
          `${ctx.configText()}\n[server]\nurl = "ws://127.0.0.1:9/runner"\ntoken_env = "WEBCODEX_RUNNER_TOKEN"\n`,
          { mode: 0o600 },
        );
        const run = await execFileP(process.execPath, [RUNNER_BIN, "run", "--config", file], {
          env: { ...process.env, WEBCODEX_RUNNER_TOKEN: "wcr_test" },
          timeout: 30_000,
        }).then(
          () => ({ code: 0, stderr: "" }),
          (e: { code: number; stderr: string }) => ({ code: e.code, stderr: e.stderr }),
        );
        expect(run.code).toBe(2);
        expect(run.stderr).toContain(`chmod 700 ${home}`);
      } finally {
        chmodSync(home, 0o700);
      }
      expect((await check(ctx.configText())).code).toBe(0);
    });

    test("a project root writable by a group the pool users share is refused unless it is their run_as_group and no one's primary group", async () => {
      const group = `wcfs${process.pid.toString(36)}${randomBytes(2).toString("hex")}`;
      execFileSync("groupadd", [group]);
      for (const u of ctx.users) execFileSync("usermod", ["-aG", group, u.name]);
      const gid = Number(execFileSync("getent", ["group", group], { encoding: "utf8" }).split(":")[2]);
      chownSync(ctx.project, 0, gid);
      chmodSync(ctx.project, 0o2775);
      try {
        const refused = await check(ctx.configText());
        expect(refused.code).toBe(2);
        expect(refused.stderr).toContain(`project demo: its root ${ctx.project} is writable by its group (gid ${gid})`);
        expect(refused.stderr).toContain("it is not the run_as_group of pooled");
        expect(refused.stderr).toContain("Giving agents a project through a group");
        // The recipe: the shared group named as run_as_group.
        const recipe = await check(ctx.configText(`run_as_group = ${JSON.stringify(group)}`));
        expect(recipe.code, recipe.stderr).toBe(0);
        // The same, unit-level with the group database handed in: the group is also a user's primary group.
        const config = parseConfig(ctx.configText(`run_as_group = ${JSON.stringify(group)}`), ctx.configFile);
        expect(poolHomeRefusals(config)).toEqual([]);
      } finally {
        chmodSync(ctx.project, 0o755);
        chownSync(ctx.project, 0, 0);
        for (const u of ctx.users) execFileSync("gpasswd", ["-d", u.name, group], { stdio: "ignore" });
        execFileSync("groupdel", [group]);
      }
      expect((await check(ctx.configText())).code).toBe(0);
    });
  },
);
