/**
 * A sandbox per run under run_as (issue 39 §1 and §2, design §4.2) with real processes, the real Runner and
 * OS users created for the test: one caller's run plants a 0777 script in /tmp, files in /var/tmp and
 * /dev/shm and a 0666 System V shared-memory segment, and neither another caller's concurrent run nor
 * later runs see any of it; the agent still writes temp files and runs git; a run cannot make a shared
 * project's git run its code in another caller's run (the fsmonitor plant); a project serves one caller
 * unless the operator shares it; and a Runner that cannot make the namespaces refuses to start, naming
 * `[acp] sandbox = "none"`.
 *
 * Creating users and switching to them needs root (CI runs the suite as root): as any other user this
 * file's tests are skipped, and the describe title says why.
 */
import { execFile, execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { type LedgerLine, poll, RUNNER_BIN, readLedger } from "../../../../scripts/test-support/index.js";
import { ConfigError, parseConfig, type RunnerConfig } from "../../src/config/config.js";
import { findSystemTool } from "../../src/config/run-as.js";
import { findSandboxTools } from "../../src/config/sandbox-tools.js";
import { setprivCommand } from "../../src/process/run-as.js";
import { sandboxCommand } from "../../src/process/sandbox.js";
import { FilePoolBindings } from "../../src/process/user-bindings.js";
import { PROJECT_SERVES_ANOTHER_CALLER } from "../../src/runs/project-callers.js";
import { newManager, runToEnd, startRequest } from "../support/harness.js";
import {
  agentCopy,
  createTestUser,
  IS_ROOT,
  removePoolFixture,
  sharedTestDir,
  type TestUser,
} from "../support/test-user.js";

const execFileP = promisify(execFile);
/** Longest a test waits for a live run's ledger line. */
const LEDGER_WAIT_MS = 30_000;
/** Longest a test that starts several Runner command lines may take (a loaded machine: 3x slower). */
const CLI_TEST_TIMEOUT_MS = 120_000;
const T1 = "tn_aaaaaaaaaaaaaaaaaaaaaaaaaa";
const T2 = "tn_bbbbbbbbbbbbbbbbbbbbbbbbbb";
const T3 = "tn_cccccccccccccccccccccccccc";
const SETPRIV = findSystemTool("setpriv") ?? "setpriv";

interface Ctx {
  users: [TestUser, TestUser];
  agent: ReturnType<typeof agentCopy>;
  dir: string;
  ledger: string;
  repo: string;
  configFile: string;
  text: string;
  config: RunnerConfig;
}
let ctx: Ctx;

const canary = () => randomBytes(24).toString("hex");

/** The first ledger line after the first `from` lines that matches, once it appears. */
function ledgerLine(from: number, match: (l: LedgerLine) => boolean): Promise<LedgerLine> {
  return poll(() => readLedger(ctx.ledger).slice(from).find(match), {
    timeoutMs: LEDGER_WAIT_MS,
    what: "the ledger line",
  });
}

/** Keys (hex) of the System V shared-memory segments of this (the host's) IPC namespace. */
function hostShmKeys(): string[] {
  return readFileSync("/proc/sysvipc/shm", "utf8")
    .split("\n")
    .slice(1)
    .map((l) => l.trim().split(/\s+/)[0] ?? "")
    .filter((k) => k !== "")
    .map((k) => (Number(k) >>> 0).toString(16));
}

/** A manager whose pool users and projects are bound to callers, as the daemon's are. */
function boundManager() {
  const stateDir = mkdtempSync(join(tmpdir(), "wc-sandbox-bindings-"));
  const bindings = new FilePoolBindings(stateDir);
  const { manager } = newManager(ctx.config, { poolBindings: bindings });
  return {
    manager,
    bindings,
    async close() {
      await manager.close();
      rmSync(stateDir, { recursive: true, force: true });
    },
  };
}

/** Runs `prompt` of `tenant` on `project` to its end; the ledger lines it added. */
async function runOf(
  manager: ReturnType<typeof boundManager>["manager"],
  tenant: string,
  prompt: string,
  project = "demo",
) {
  const before = readLedger(ctx.ledger).length;
  const done = await runToEnd(manager, prompt, { provider_id: "pooled", tenant, project_id: project });
  return { ...done, lines: readLedger(ctx.ledger).slice(before) };
}

describe.skipIf(!IS_ROOT)("a sandbox per run_as run (needs root to create users and switch to them)", () => {
  beforeAll(() => {
    const users: [TestUser, TestUser] = [createTestUser("s1"), createTestUser("s2")];
    const agent = agentCopy();
    const dir = sharedTestDir("wc-sandbox-");
    const ledger = join(dir, "ledger.jsonl");
    writeFileSync(ledger, "");
    chmodSync(ledger, 0o666);
    const demo = join(dir, "demo");
    const solo = join(dir, "solo");
    const repo = join(dir, "repo");
    for (const p of [demo, solo, repo]) mkdirSync(p);
    // A shared repository both pool users may write (the project's files are shared; its git config is not).
    const git = (...args: string[]) => execFileSync("git", ["-C", repo, ...args], { stdio: "ignore" });
    git("init", "-q");
    git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "--allow-empty", "-m", "root");
    execFileSync("chmod", ["-R", "a+rwX", demo, solo, repo]);
    const project = (id: string, root: string, shared: boolean) => [
      "[[projects]]",
      `id = "${id}"`,
      `root = ${JSON.stringify(root)}`,
      "allow_patch = true",
      `shared_between_callers = ${shared}`,
    ];
    const text = [
      "[runner]",
      `state_dir = ${JSON.stringify(join(dir, "state"))}`,
      ...project("demo", demo, true),
      ...project("repo", repo, true),
      ...project("solo", solo, false),
      "[acp]",
      "max_concurrent_runs = 4",
      "cancel_grace_secs = 2",
      "[[acp.agents]]",
      'id = "pooled"',
      `executable = ${JSON.stringify(agent.bin)}`,
      `args = ${JSON.stringify(["--ledger", ledger])}`,
      `run_as = ${JSON.stringify(users.map((u) => u.name))}`,
      "[acp.agents.env_from_env]",
      'PATH = "PATH"',
    ].join("\n");
    const configFile = join(dir, "runner.toml");
    writeFileSync(configFile, `${text}\n`, { mode: 0o600 });
    ctx = { users, agent, dir, ledger, repo, configFile, text, config: parseConfig(text, configFile) };
  });

  afterAll(async () => {
    if (!ctx) return;

    // Nothing of the test users may be left running; whatever is (a failed test) dies before they go.

    expect(await removePoolFixture(ctx)).toEqual([]);
  });

  test("one caller's plants in /tmp, /var/tmp, /dev/shm and System V shm reach neither another caller's concurrent and later runs nor outlive the run", async () => {
    const { manager, close } = boundManager();
    try {
      const [a, b] = ctx.users;
      const tag = canary();
      const before = readLedger(ctx.ledger).length;
      const holder = startRequest(manager, `scenario: plant tag=${tag} hold=true`, {
        provider_id: "pooled",
        tenant: T1,
      });
      expect((await manager.start(holder)).ok).toBe(true);
      const planted = await ledgerLine(before, (l) => l.event === "planted" && l.tag === tag);
      // The plants are there, for the planting run itself (the check below could see them) …
      expect(planted.uid).toBe(a.uid);
      expect(planted.wrote).toEqual({ tmp: "written", var_tmp: "written", shm: "written" });
      expect(planted.shm_key).toMatch(/^[0-9a-f]+$/);
      expect(planted.seen).toEqual({ tmp: true, var_tmp: true, shm: true, sysv_shm: true });
      const key = planted.shm_key as string;
      // … and in the run's namespaces only: not on the machine.
      for (const path of [`/tmp/wc-plant-${tag}.sh`, `/var/tmp/wc-plant-${tag}`, `/dev/shm/wc-plant-${tag}`]) {
        expect(existsSync(path), path).toBe(false);
      }
      expect(hostShmKeys()).not.toContain(key);

      // Another caller's run, while the planting run lives: sees none of it, and works with its own /tmp.
      const concurrent = await runOf(manager, T2, `scenario: seek tag=${tag} key=${key}`);
      expect(concurrent.run.state).toBe("completed");
      expect(concurrent.lines.find((l) => l.event === "sought")).toMatchObject({
        uid: b.uid,
        found: { tmp: false, var_tmp: false, shm: false, sysv_shm: false },
        temp: "ok",
      });

      await manager.cancel(holder.run_id);
      await manager.whenSettled(holder.run_id);

      // Later runs: the other caller's, and the planting caller's own (same pool user): nothing outlived the run.
      for (const [tenant, uid] of [
        [T2, b.uid],
        [T1, a.uid],
      ] as const) {
        const later = await runOf(manager, tenant, `scenario: seek tag=${tag} key=${key}`);
        expect(later.run.state).toBe("completed");
        expect(later.lines.find((l) => l.event === "sought")).toMatchObject({
          uid,
          found: { tmp: false, var_tmp: false, shm: false, sysv_shm: false },
          temp: "ok",
        });
      }
      expect(hostShmKeys()).not.toContain(key);
    } finally {
      await close();
    }
  });

  test("the agent still runs git in the project: status, add and commit", async () => {
    const { manager, close } = boundManager();
    try {
      const name = `work-${canary().slice(0, 16)}`;
      const { run, lines } = await runOf(manager, T1, `scenario: git_work name=${name}`, "repo");
      expect(run.state).toBe("completed");
      expect(lines.find((l) => l.event === "git_worked")?.status).toEqual({
        status: 0,
        add: 0,
        commit: 0,
        status_after: 0,
      });
      expect(execFileSync("git", ["-C", ctx.repo, "log", "-1", "--format=%s"], { encoding: "utf8" }).trim()).toBe(name);
    } finally {
      await close();
    }
  });

  test("a shared project's git config, hooks and attributes are read-only to a run: a planted core.fsmonitor never runs as another caller", async () => {
    const { manager, close } = boundManager();
    const canaryFile = join(ctx.dir, `fsmonitor-ran-${canary()}`);
    // Any pool user may create the canary, so that the plant would show if it ran.
    chmodSync(ctx.dir, 0o1777);
    try {
      const plant = await runOf(
        manager,
        T1,
        `scenario: git_plant script=plant-${canary().slice(0, 12)}.sh canary=${canaryFile}`,
        "repo",
      );
      expect(plant.run.state).toBe("completed");
      const result = plant.lines.find((l) => l.event === "git_planted")?.result as Record<string, unknown>;
      expect(result.fsmonitor).not.toBe(0);
      expect(result.include).not.toBe(0);
      expect(result.hook).toBe("EROFS");
      expect(result.attributes).toBe("EROFS");
      const config = readFileSync(join(ctx.repo, ".git", "config"), "utf8");
      expect(config).not.toContain("fsmonitor");
      expect(config).not.toContain("include");

      // Another caller's run runs `git status` (fsmonitor's trigger) in the same tree, to its terminal.
      const victim = await runOf(manager, T2, `scenario: git_work name=victim-${canary().slice(0, 12)}`, "repo");
      expect(victim.run.state).toBe("completed");
      expect(victim.lines.find((l) => l.event === "git_worked")?.uid).toBe(ctx.users[1].uid);
      expect(existsSync(canaryFile)).toBe(false);
    } finally {
      chmodSync(ctx.dir, 0o755);
      rmSync(canaryFile, { force: true });
      await close();
    }
  });

  test("a project not shared between callers serves the caller of its first run_as run; another's run fails not_started before anything is spawned", async () => {
    const { manager, bindings, close } = boundManager();
    try {
      const first = await runOf(manager, T1, "scenario: hello", "solo");
      expect(first.run.state).toBe("completed");
      const before = readLedger(ctx.ledger).length;
      const other = await runOf(manager, T3, "scenario: hello", "solo");
      expect(other.run).toMatchObject({
        state: "failed",
        execution_state: "not_started",
        failure_kind: "provider_spawn_failed",
        recovery_kind: "none",
      });
      expect(other.run.message).toContain(PROJECT_SERVES_ANOTHER_CALLER);
      expect(other.run.message).toContain("shared_between_callers = true");
      // Nothing was spawned, and no pool user was bound to the refused caller.
      expect(readLedger(ctx.ledger).slice(before)).toEqual([]);
      expect([...bindings.load().values()].map((b) => b.tenant)).not.toContain(T3);
      // The first caller keeps the project.
      expect((await runOf(manager, T1, "scenario: hello", "solo")).run.state).toBe("completed");
    } finally {
      await close();
    }
  });

  test(
    'a Runner that cannot create the namespaces refuses to start, naming [acp] sandbox = "none"; with it, it starts',
    async () => {
      // Root without CAP_SYS_ADMIN (dropped from the bounding set): it can still switch users, not unshare.
      const check = async (configFile: string, command = "check") => {
        try {
          const { stdout } = await execFileP(
            SETPRIV,
            ["--bounding-set=-sys_admin", "--", process.execPath, RUNNER_BIN, command, "--config", configFile],
            {
              env: { ...process.env, WC_SANDBOX_TEST_TOKEN: "runner-token-aaaaaaaaaaaaaaaa" },
              timeout: LEDGER_WAIT_MS,
            },
          );
          return { code: 0, stdout, stderr: "" };
        } catch (error) {
          const e = error as { code: number; stdout: string; stderr: string };
          return { code: e.code, stdout: e.stdout, stderr: e.stderr };
        }
      };
      const refused = await check(ctx.configFile);
      expect(refused.code, refused.stdout).toBe(2);
      expect(refused.stderr).toContain(
        `${ctx.configFile}: acp.sandbox: "namespaces" (the default with run_as) gives each run_as agent its own mount and IPC namespace, and this Runner cannot create them (`,
      );
      expect(refused.stderr).toContain('or set [acp] sandbox = "none" to run agents without a private /tmp');
      // The daemon refuses to start with the same words (a [server] nobody answers: it stops before connecting).
      const daemonConfig = join(ctx.dir, "runner-daemon.toml");
      writeFileSync(
        daemonConfig,
        `${ctx.text.replace("[[projects]]", '[server]\nurl = "ws://127.0.0.1:9/runner"\ntoken_env = "WC_SANDBOX_TEST_TOKEN"\n[[projects]]')}\n`,
        { mode: 0o600 },
      );
      const daemon = await check(daemonConfig, "run");
      expect(daemon.code).toBe(2);
      expect(daemon.stderr).toContain(`${daemonConfig}: acp.sandbox: "namespaces" (the default with run_as)`);
      const optOut = join(ctx.dir, "runner-none.toml");
      writeFileSync(optOut, `${ctx.text.replace("[acp]\n", '[acp]\nsandbox = "none"\n')}\n`, { mode: 0o600 });
      const started = await check(optOut);
      expect(started.code, started.stderr).toBe(0);
      expect(started.stdout).toContain("config OK");
      expect(started.stdout).toContain('warning: [acp] sandbox = "none": run_as agents share the machine\'s /tmp');
      // With the capability, the default: the sandbox is on and `check` says so.
      const { stdout } = await execFileP(process.execPath, [RUNNER_BIN, "check", "--config", ctx.configFile]);
      expect(stdout).toContain("  sandbox: namespaces (each run_as agent: its own /tmp, /var/tmp, /dev/shm and IPC");
    },
    CLI_TEST_TIMEOUT_MS,
  );

  test("a non-root Runner with the unit's ambient capabilities plus CAP_SYS_ADMIN starts its agents sandboxed; without it, not", async () => {
    const [runner, agentUser] = ctx.users;
    const runAs = ctx.config.acp.agents[0]?.runAs?.users.find((u) => u.uid === agentUser.uid);
    if (!runAs) throw new Error("no pool user");
    const found = findSandboxTools(runner.uid);
    if (!found.ok) throw new Error(found.reason);
    expect(found.tools.asRoot).toMatch(/\/setpriv$/);
    // Something in the machine's /tmp that a sandboxed agent must not see.
    const marker = join(tmpdir(), `wc-sandbox-marker-${canary()}`);
    writeFileSync(marker, "");
    const inner = setprivCommand({ ...runAs, clearBoundingSet: false }, "/bin/sh", [
      "-c",
      `id -u; ls -A /tmp /var/tmp /dev/shm | grep -c . || true; test -e ${marker} && echo visible || echo hidden`,
    ]);
    const command = sandboxCommand(found.tools, null, inner);
    const asRunner = (caps: string) =>
      execFileP(SETPRIV, [
        `--reuid=${runner.uid}`,
        `--regid=${runner.gid}`,
        "--init-groups",
        `--inh-caps=${caps}`,
        `--ambient-caps=${caps}`,
        "--",
        command.file,
        ...command.args,
      ]);
    try {
      const { stdout } = await asRunner("+setuid,+setgid,+kill,+sys_admin");
      // The agent runs as its pool user, in empty /tmp, /var/tmp and /dev/shm (ls prints only the three headers).
      expect(stdout.trim().split("\n")).toEqual([String(agentUser.uid), "3", "hidden"]);
      await expect(asRunner("+setuid,+setgid,+kill")).rejects.toThrow();
    } finally {
      rmSync(marker, { force: true });
    }
  });

  test("a project root or a run_as agent's executable in a tree each run gets private is refused at load", () => {
    const hidden = mkdtempSync(join(tmpdir(), "wc-sandbox-hidden-"));
    try {
      const text = ctx.text.replace(/root = "[^"]*demo"/, `root = ${JSON.stringify(hidden)}`);
      let errors: readonly string[] = [];
      try {
        parseConfig(text, ctx.configFile);
      } catch (error) {
        if (error instanceof ConfigError) errors = error.errors;
      }
      expect(errors).toEqual([
        `${ctx.configFile}: projects[0].root: ${hidden} is in /tmp, which every run_as agent gets private and empty ([acp] sandbox = "namespaces"): the agent would not see it; move it out of /tmp, /var/tmp, /dev/shm`,
      ]);
      // Without the sandbox the same root is fine.
      expect(() => parseConfig(text.replace("[acp]\n", '[acp]\nsandbox = "none"\n'), ctx.configFile)).not.toThrow();
    } finally {
      rmSync(hidden, { recursive: true, force: true });
    }
  });
});
