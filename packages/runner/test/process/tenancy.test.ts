/**
 * Runs are kept apart (issue 25 §1, design §4.2) with real processes, the
 * real Runner and OS users created for the test. The attacks of the issue as
 * scenarios of the fake agent: a tool that double-forks a sleeper or
 * `setsid`s a child (both outside the agent's process group, so the group
 * kill misses them), and a run that reads another live run's
 * `/proc/<pid>/environ` and memory. With a `run_as` pool every concurrent run
 * holds a user of its own and every process of that user is killed when the
 * run ends, so nothing escapes and nothing is readable across runs.
 *
 * Creating users and switching to them needs root (CI runs the suite as
 * root): as any other user this file's tests are skipped, as run-as.test.ts's
 * are, and the describe title says why.
 */

import { execFile, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { alive, type LedgerLine, poll, RUNNER_BIN, readLedger } from "../../../../scripts/test-support/index.js";
import { parseConfig, type RunnerConfig } from "../../src/config/config.js";
import { findSystemTool } from "../../src/config/run-as.js";
import { listUidProcesses } from "../../src/process/proc-identity.js";
import { BINDINGS_FILE, FilePoolBindings } from "../../src/process/user-bindings.js";
import { openDispatchStore } from "../../src/store/open.js";
import { newManager, runToEnd, startRequest, waitForState } from "../support/harness.js";
import {
  agentCopy,
  createTestUser,
  IS_ROOT,
  pooledRunnerHead,
  removePoolFixture,
  runnerExec,
  sharedTestDir,
  type TestUser,
  uidOf,
} from "../support/test-user.js";

const execFileP = promisify(execFile);
/** The env var the pooled agent gets (mapped from CANARY_SOURCE); its value is a fresh random canary. */
const CANARY_NAME = "WC_TENANCY_CANARY";
const CANARY_SOURCE = "WC_TENANCY_CANARY_SOURCE";
const CANARY = `tenancy-canary-${randomBytes(24).toString("hex")}`;
/** Longest a test waits for a live run's agent to show up in the ledger. */
const LEDGER_WAIT_MS = 15_000;
const SETPRIV = findSystemTool("setpriv") ?? "setpriv";

interface Ctx {
  users: [TestUser, TestUser];
  agent: ReturnType<typeof agentCopy>;
  dir: string;
  ledger: string;
  configFile: string;
  config: RunnerConfig;
}
let ctx: Ctx;

/** The first ledger line after the first `from` lines that matches, once it appears. */
function ledgerLine(from: number, match: (l: LedgerLine) => boolean): Promise<LedgerLine> {
  return poll(() => readLedger(ctx.ledger).slice(from).find(match), {
    timeoutMs: LEDGER_WAIT_MS,
    what: "the ledger line",
  });
}

/** `webcodex-runner exec` of one prompt with this file's config and env. */
function exec(provider: string, prompt: string) {
  return runnerExec(ctx.configFile, provider, prompt, { ...process.env, [CANARY_SOURCE]: CANARY });
}

/** Scans after a hopper's run that must each find no process of its user, HOPPER_SCAN_GAP_MS apart. */
const HOPPER_SCANS = 5;
const HOPPER_SCAN_GAP_MS = 20;

describe.skipIf(!IS_ROOT)("run_as pools keep runs apart (needs root to create users and switch to them)", () => {
  beforeAll(() => {
    const users: [TestUser, TestUser] = [createTestUser("p1"), createTestUser("p2")];
    const agent = agentCopy();
    const dir = sharedTestDir("wc-tenancy-");
    const project = join(dir, "project");
    mkdirSync(project);
    // Agents of both pool users append to one ledger.
    const ledger = join(dir, "ledger.jsonl");
    writeFileSync(ledger, "");
    chmodSync(ledger, 0o666);
    const agentTable = (id: string, runAs: string) =>
      [
        "[[acp.agents]]",
        `id = "${id}"`,
        `executable = ${JSON.stringify(agent.bin)}`,
        `args = ${JSON.stringify(["--ledger", ledger])}`,
        `run_as = ${runAs}`,
        "[acp.agents.env_from_env]",
        'PATH = "PATH"',
        `${CANARY_NAME} = "${CANARY_SOURCE}"`,
      ].join("\n");
    const text = [
      ...pooledRunnerHead(dir, project),
      agentTable("pooled", JSON.stringify(users.map((u) => u.name))),
      // Shares the first pool user with "pooled": a user serves one live run, whichever agent's.
      agentTable("single", JSON.stringify(users[0].name)),
    ].join("\n");
    const configFile = join(dir, "runner.toml");
    writeFileSync(configFile, `${text}\n`, { mode: 0o600 });
    ctx = { users, agent, dir, ledger, configFile, config: parseConfig(text, configFile) };
  });

  afterAll(async () => {
    if (!ctx) return;

    // Nothing of the test users may be left running; whatever is (a failed test) dies before they go.

    expect(await removePoolFixture(ctx)).toEqual([]);
  });

  test("check names each agent's pool and the concurrency it allows", async () => {
    const { stdout } = await execFileP(process.execPath, [RUNNER_BIN, "check", "--config", ctx.configFile]);
    const [u1, u2] = ctx.users;
    expect(stdout).toContain(`agents: pooled (as ${u1.name}, ${u2.name}), single (as ${u1.name})`);
    expect(stdout).toContain("note: agent pooled runs at most 2 runs at once");
    expect(stdout).toContain("note: agent single runs at most 1 run at once");
  });

  test.each([
    ["double_fork", "a double-forked sleeper (parent PID 1, a session of its own)"],
    ["setsid", "a setsid'd child"],
  ])("%s: %s does not outlive the run, and the next run of that user finds nothing left", async (how) => {
    const before = readLedger(ctx.ledger).length;
    const { code, stdout, stderr } = await exec("single", `scenario: escape how=${how}`);
    expect(code, stdout + stderr).toBe(0);
    expect(stdout).toMatch(/"state":"completed"/);
    const escaped = readLedger(ctx.ledger)
      .slice(before)
      .find((l) => l.event === "escaped");
    const pid = escaped?.pid as number;
    expect(pid).toBeGreaterThan(0);
    // It really left the agent's process group (the group kill alone would miss it) …
    expect(escaped?.pgid).not.toBe(escaped?.agent_pid);
    if (how === "setsid") expect(escaped?.sid).toBe(pid);
    // … and is gone when exec returns (exec waits for the run to settle).
    expect(alive(pid)).toBe(false);

    const next = await exec("single", "scenario: leftovers");
    expect(next.code, next.stdout + next.stderr).toBe(0);
    const count = readLedger(ctx.ledger)
      .slice(before)
      .find((l) => l.event === "leftovers");
    expect(count).toEqual({ event: "leftovers", uid: ctx.users[0].uid, count: 0 });
  });

  test("exec refuses pool agents while a daemon holds this config's store, and kills none of its users' processes", async () => {
    // The test process stands in for the daemon: it holds the store of the config's state_dir open.
    const { store } = openDispatchStore({ stateDir: ctx.config.runner.stateDir });
    try {
      const { code, stderr } = await exec("single", "scenario: hello");
      expect(code).toBe(2);
      expect(stderr).toContain("run_as pool users that the Runner daemon");
      expect(stderr).toContain("nothing was started");
    } finally {
      store.close();
    }
  });

  test("a process that forks and exits over and over (a new pid every hop) does not outlive the run", async () => {
    const before = readLedger(ctx.ledger).length;
    const { code, stdout, stderr } = await exec("single", "scenario: escape how=hopper");
    expect(code, stdout + stderr).toBe(0);
    expect(
      readLedger(ctx.ledger)
        .slice(before)
        .some((l) => l.event === "escaped" && l.how === "hopper"),
    ).toBe(true);
    // exec returns once the run is settled, i.e. after the sweep: nothing of the user may run now, or later.
    const user = new Set([ctx.users[0].uid]);
    for (let scan = 0; scan < HOPPER_SCANS; scan++) {
      expect(listUidProcesses(user)).toEqual([]);
      await new Promise((r) => setTimeout(r, HOPPER_SCAN_GAP_MS));
    }
  });

  test("concurrent runs hold different users; one cannot read the other's environ or memory; a third is refused", async () => {
    const { manager } = newManager(ctx.config, { sourceEnv: { ...process.env, [CANARY_SOURCE]: CANARY } });
    try {
      const before = readLedger(ctx.ledger).length;
      const first = startRequest(manager, "scenario: slow interval_ms=100 count=600", { provider_id: "pooled" });
      expect((await manager.start(first)).ok).toBe(true);
      await waitForState(manager, first.run_id, "running");
      const prompt = await ledgerLine(before, (l) => l.event === "prompt");
      const victim = prompt.pid as number;
      expect(uidOf(victim)).toBe(ctx.users[0].uid);

      // The same user can read both (what one run_as user for every run allowed): the canary and the maps.
      const [u1] = ctx.users;
      const sameUser = await execFileP(SETPRIV, [
        `--reuid=${u1.uid}`,
        `--regid=${u1.gid}`,
        "--clear-groups",
        "--",
        "/bin/sh",
        "-c",
        `tr '\\0' '\\n' < /proc/${victim}/environ; head -c 64 /proc/${victim}/maps`,
      ]);
      expect(sameUser.stdout).toContain(`${CANARY_NAME}=${CANARY}`);
      expect(sameUser.stdout).toMatch(/^[0-9a-f]+-[0-9a-f]+ r/m);

      // The second concurrent run gets the other pool user and reads nothing of the first.
      const { run, events } = await runToEnd(manager, `scenario: read_process pid=${victim} env_name=${CANARY_NAME}`, {
        provider_id: "pooled",
      });
      expect(run.state).toBe("completed");
      const read = readLedger(ctx.ledger).find((l) => l.event === "process_read" && l.pid === victim);
      expect(read?.result).toEqual({ environ: "EACCES", maps: "EACCES", mem: "EACCES" });
      expect(JSON.stringify(events)).not.toContain(CANARY);

      // The reader's user was swept and is free again: another run takes it, and while two runs live, a
      // start of either agent is refused at capacity (the single agent's one user is the first run's).
      const second = startRequest(manager, "scenario: slow interval_ms=100 count=600", { provider_id: "pooled" });
      expect((await manager.start(second)).ok).toBe(true);
      const refused = await manager.start(startRequest(manager, "scenario: hello", { provider_id: "pooled" }));
      expect(refused).toMatchObject({ ok: false, code: "capacity" });
      const shared = await manager.start(startRequest(manager, "scenario: hello", { provider_id: "single" }));
      expect(shared).toMatchObject({ ok: false, code: "capacity" });

      await manager.cancel(first.run_id);
      await manager.cancel(second.run_id);
      await manager.whenSettled(first.run_id);
      await manager.whenSettled(second.run_id);
      // Users free again: the single agent's run (first pool user) starts.
      const { run: after } = await runToEnd(manager, "scenario: hello", { provider_id: "single" });
      expect(after.state).toBe("completed");
    } finally {
      await manager.close();
    }
  });

  test("a user that served one caller never serves another: a file a run leaves is not the next caller's to read", async () => {
    const T1 = "tn_aaaaaaaaaaaaaaaaaaaaaaaaaa";
    const T2 = "tn_bbbbbbbbbbbbbbbbbbbbbbbbbb";
    const T3 = "tn_cccccccccccccccccccccccccc";
    const stateDir = mkdtempSync(join(tmpdir(), "wc-bindings-"));
    const name = `wc-note-${randomBytes(8).toString("hex")}`;
    // Not an env value (the Runner would redact that from events): a note only the writing run knows.
    const note = `note-canary-${randomBytes(24).toString("hex")}`;
    const { manager } = newManager(ctx.config, {
      poolBindings: new FilePoolBindings(stateDir),
      sourceEnv: { ...process.env, [CANARY_SOURCE]: CANARY },
    });
    try {
      await manager.usersReady;
      const run = async (tenant: string, prompt: string) => {
        const before = readLedger(ctx.ledger).length;
        const done = await runToEnd(manager, prompt, { provider_id: "pooled", tenant });
        return { ...done, lines: readLedger(ctx.ledger).slice(before) };
      };
      // The first caller's run leaves a private note (0600, its user's) behind, in a directory every run sees
      // (each run's /tmp is its own, sandbox.test.ts).
      const notes = join(ctx.dir, "notes");
      mkdirSync(notes, { recursive: true });
      chmodSync(notes, 0o1777);
      const wrote = await run(T1, `scenario: note op=write name=${name} text=${note} dir=${notes}`);
      expect(wrote.run.state).toBe("completed");
      const writer = wrote.lines.find((l) => l.event === "note_written")?.uid;
      expect(writer).toBe(ctx.users[0].uid);

      // The second caller's run, one after the other, gets the other user even though the first is free.
      const other = await run(T2, `scenario: note op=read name=${name} dir=${notes}`);
      expect(other.run.state).toBe("completed");
      expect(other.lines.find((l) => l.event === "note_read")).toMatchObject({
        uid: ctx.users[1].uid,
        result: "EACCES",
      });
      expect(JSON.stringify(other.events)).not.toContain(note);

      // Control: the first caller's next run (its own user again) does read it, so the check above could fail.
      const own = await run(T1, `scenario: note op=read name=${name} dir=${notes}`);
      expect(own.lines.find((l) => l.event === "note_read")).toMatchObject({ uid: ctx.users[0].uid, result: "read" });
      expect(JSON.stringify(own.events)).toContain(note);

      // A third caller: both users are free but bound to others; refused, nothing started.
      const before = readLedger(ctx.ledger).length;
      const refused = await manager.start(
        startRequest(manager, "scenario: hello", { provider_id: "pooled", tenant: T3 }),
      );
      expect(refused).toMatchObject({
        ok: false,
        code: "capacity",
        message: expect.stringContaining("another caller"),
      });
      expect(readLedger(ctx.ledger).slice(before)).toEqual([]);
    } finally {
      await manager.close();
      rmSync(stateDir, { recursive: true, force: true });
    }
  });

  test("`pool` lists which caller each user serves; `pool release` frees one, only while no daemon runs", async () => {
    const [u1, u2] = ctx.users;
    const stateDir = ctx.config.runner.stateDir;
    mkdirSync(stateDir, { recursive: true, mode: 0o700 });
    const pool = async (...args: string[]) => {
      try {
        const { stdout, stderr } = await execFileP(process.execPath, [
          RUNNER_BIN,
          "pool",
          "--config",
          ctx.configFile,
          ...args,
        ]);
        return { code: 0, stdout, stderr };
      } catch (error) {
        const e = error as { code: number; stdout: string; stderr: string };
        return { code: e.code, stdout: e.stdout, stderr: e.stderr };
      }
    };
    const tag = "tn_dddddddddddddddddddddddddd";
    new FilePoolBindings(stateDir).bind({
      uid: u1.uid,
      user: u1.name,
      tenant: tag,
      bound_at: new Date().toISOString(),
    });
    try {
      const listed = await pool();
      expect(listed.code).toBe(0);
      expect(listed.stdout).toContain(`${u1.name} (uid ${u1.uid}; pooled, single): caller ${tag}`);
      expect(listed.stdout).toContain(`${u2.name} (uid ${u2.uid}; pooled): no caller yet`);

      const { store } = openDispatchStore({ stateDir });
      try {
        const busy = await pool("release", u1.name);
        expect(busy.code).toBe(1);
        expect(busy.stderr).toContain("stop it first");
        expect(new FilePoolBindings(stateDir).load().get(u1.uid)?.tenant).toBe(tag);
      } finally {
        store.close();
      }

      const released = await pool("release", u1.name);
      expect(released.code, released.stderr).toBe(0);
      expect(new FilePoolBindings(stateDir).load().has(u1.uid)).toBe(false);
      expect((await pool()).stdout).toContain(`${u1.name} (uid ${u1.uid}; pooled, single): no caller yet`);
      expect((await pool("release", u1.name)).code).toBe(1);
      expect((await pool("free", u1.name)).code).toBe(2);
    } finally {
      rmSync(join(stateDir, BINDINGS_FILE), { force: true });
    }
  });

  test("a bindings file that cannot be read stops `run` and `pool` (exit 3, naming the file and field); nothing is guessed", async () => {
    const dir = mkdtempSync(join(tmpdir(), "wc-bindings-daemon-"));
    try {
      const stateDir = join(dir, "state");
      mkdirSync(stateDir, { mode: 0o700 });
      const file = join(stateDir, BINDINGS_FILE);
      writeFileSync(file, JSON.stringify({ version: 1, bindings: [{ uid: ctx.users[0].uid, user: "x", tenant: 7 }] }));
      // The same agents, a state dir of its own and a [server] nobody answers: `run` stops before it connects.
      const text = readFileSync(ctx.configFile, "utf8")
        .replace(/^state_dir = .*$/m, `state_dir = ${JSON.stringify(stateDir)}`)
        .replace(
          "[[projects]]",
          '[server]\nurl = "ws://127.0.0.1:9/runner"\ntoken_env = "WC_TEST_RUNNER_TOKEN"\n[[projects]]',
        );
      const configFile = join(dir, "runner.toml");
      writeFileSync(configFile, text, { mode: 0o600 });
      const run = async (...args: string[]) => {
        try {
          await execFileP(process.execPath, [RUNNER_BIN, ...args, "--config", configFile], {
            env: { ...process.env, WC_TEST_RUNNER_TOKEN: "runner-token-aaaaaaaaaaaaaaaa" },
            timeout: LEDGER_WAIT_MS,
          });
          return { code: 0, stderr: "" };
        } catch (error) {
          const e = error as { code: number; stderr: string };
          return { code: e.code, stderr: e.stderr };
        }
      };
      for (const command of ["run", "pool"]) {
        const { code, stderr } = await run(command);
        expect(code, stderr).toBe(3);
        expect(stderr).toContain(`${file}: bindings.0.`);
      }
      expect((await run("run")).stderr).toContain("the Runner does not guess");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("a Runner starting up kills what an earlier Runner's run left running as a pool user", async () => {
    const [, u2] = ctx.users;
    // A leftover of a crashed Runner's run: a sleeper of the second pool user in a session of its own.
    const leftover = spawn(
      SETPRIV,
      [`--reuid=${u2.uid}`, `--regid=${u2.gid}`, "--clear-groups", "--", "/bin/sleep", "600"],
      { detached: true, stdio: "ignore" },
    );
    leftover.unref();
    const pid = leftover.pid as number;
    await poll(() => uidOf(pid) === u2.uid, {
      timeoutMs: LEDGER_WAIT_MS,
      what: "the leftover to run as the pool user",
    });

    const { manager } = newManager(ctx.config);
    try {
      await manager.usersReady;
      expect(alive(pid)).toBe(false);
    } finally {
      await manager.close();
    }
  });
});
