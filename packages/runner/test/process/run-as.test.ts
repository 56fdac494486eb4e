/**
 * `[[acp.agents]] run_as` (issue 19 §1, design §4.2) with real processes and
 * a real OS user created for the test. The attack of the issue as a scenario:
 * the fake agent (`read_credentials`) reads its parent's `/proc/<pid>/environ`,
 * follows `/proc/<pid>/cmdline` → `--config` → `token_file`, the way a
 * prompt-injected `cat` would. As the Runner's own user it reads all of it;
 * run as another user it reads none of it, holds that user's ids and groups
 * and no capabilities, and the Runner still cleans up and reaps its tree.
 *
 * Switching users needs root (CI runs the suite as root): as any other user
 * this file's tests are skipped, and the describe title says why.
 */
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { chmodSync, chownSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { alive, RUNNER_BIN as BIN, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { parseConfig, type RunnerConfig } from "../../src/config/config.js";
import { switchUserSupportFrom } from "../../src/config/run-as.js";
import { listGroupMembers, readStartTime } from "../../src/process/proc-identity.js";
import { reapGroup } from "../../src/process/reaper.js";
import { setprivCommand } from "../../src/process/run-as.js";
import { spawnAgent } from "../../src/process/spawn.js";
import { groupMembers, newManager, runToEnd } from "../support/harness.js";
import {
  agentCopy,
  createTestUser,
  IS_ROOT,
  runnerExec,
  sharedTestDir,
  type TestUser,
  uidOf,
} from "../support/test-user.js";

const execFileP = promisify(execFile);
const TOKEN = "runner-token-9f8e7d6c5b4a39281706";
const TOKEN_ENV = "WC_RUNAS_TEST_TOKEN";

interface Ctx {
  user: TestUser;
  agent: ReturnType<typeof agentCopy>;
  dir: string;
  /** Owned by the test user: both agents write their ledgers here (one file each: root's would be read-only to the user). */
  agentDir: string;
  ledgers: { same: string; isolated: string };
  tokenFile: string;
  configFile: string;
  config: RunnerConfig;
}
let ctx: Ctx;

interface CredentialsLine {
  event: "credentials";
  identity: {
    uid: number;
    gid: number;
    groups: number[];
    cap_eff: string;
    cap_prm: string;
    cap_amb: string;
    cap_bnd: string;
    no_new_privs: string;
  };
  result: Record<string, { outcome: string; sha256?: string } | boolean>;
}

function ledgerLines(agent: "same" | "isolated" = "isolated"): { event: string; [k: string]: unknown }[] {
  let text = "";
  try {
    text = readFileSync(ctx.ledgers[agent], "utf8");
  } catch {
    return [];
  }
  return text
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => JSON.parse(l));
}

/** `webcodex-runner exec` of one prompt with this file's config and env. */
function exec(provider: string, prompt: string) {
  return runnerExec(ctx.configFile, provider, prompt, { ...process.env, [TOKEN_ENV]: TOKEN });
}

describe.skipIf(!IS_ROOT)("run_as (needs root to create a user and switch to it; CI runs as root)", () => {
  beforeAll(() => {
    const user = createTestUser("ra");
    const agent = agentCopy();
    const dir = sharedTestDir("wc-runas-");
    chmodSync(dir, 0o700);
    const project = join(dir, "project");
    const agentDir = sharedTestDir("wc-runas-agent-");
    chownSync(agentDir, user.uid, user.gid);
    const tokenFile = join(dir, "runner.token");
    writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
    const ledgers = { same: join(agentDir, "same.jsonl"), isolated: join(agentDir, "isolated.jsonl") };
    const agentTable = (id: "same" | "isolated", runAs: string | null) =>
      [
        "[[acp.agents]]",
        `id = "${id}"`,
        `executable = ${JSON.stringify(agent.bin)}`,
        `args = ${JSON.stringify(["--ledger", ledgers[id]])}`,
        ...(runAs ? [`run_as = "${runAs}"`] : []),
        "[acp.agents.env_from_env]",
        'PATH = "PATH"',
      ].join("\n");
    const text = [
      "[runner]",
      `state_dir = ${JSON.stringify(join(dir, "state"))}`,
      "[server]",
      'url = "ws://127.0.0.1:9/runner"',
      `token_file = ${JSON.stringify(tokenFile)}`,
      "[[projects]]",
      'id = "demo"',
      `root = ${JSON.stringify(project)}`,
      "allow_patch = true",
      "[acp]",
      "agents_share_runner_user = true",
      "max_concurrent_runs = 2",
      "cancel_grace_secs = 1",
      agentTable("same", null),
      agentTable("isolated", user.name),
    ].join("\n");
    const configFile = join(dir, "runner.toml");
    mkdirSync(project);
    writeFileSync(configFile, `${text}\n`, { mode: 0o600 });
    ctx = {
      user,
      agent,
      dir,
      agentDir,
      ledgers,
      tokenFile,
      configFile,
      config: parseConfig(text, configFile),
    };
  });

  afterAll(() => {
    if (!ctx) return;
    ctx.user.remove();
    ctx.agent.remove();
    rmSync(ctx.dir, { recursive: true, force: true });
    rmSync(ctx.agentDir, { recursive: true, force: true });
  });

  test("the config resolves run_as to a pool of one: the user's ids, setpriv, and a bounding set to clear", () => {
    const isolated = ctx.config.acp.agents.find((a) => a.id === "isolated");
    expect(isolated?.runAs?.users).toHaveLength(1);
    expect(isolated?.runAs?.users[0]).toMatchObject({
      user: ctx.user.name,
      uid: ctx.user.uid,
      gid: ctx.user.gid,
      group: null,
      clearBoundingSet: true,
    });
    expect(isolated?.runAs?.users[0]?.setpriv).toMatch(/\/setpriv$/);
    expect(ctx.config.acp.agents.find((a) => a.id === "same")?.runAs).toBeNull();
  });

  test("as the Runner's own user, the agent reads the Runner's environ, config and token file (the attack)", async () => {
    const { code, stderr } = await exec("same", `scenario: read_credentials env_name=${TOKEN_ENV}`);
    expect(code, stderr).toBe(0);
    const line = ledgerLines("same").findLast((l) => l.event === "credentials") as unknown as CredentialsLine;
    expect(line.identity.uid).toBe(0);
    expect(line.result.environ).toMatchObject({ outcome: "read" });
    expect(line.result.environ_has_name).toBe(true);
    expect(line.result.config).toMatchObject({ outcome: "read" });
    expect(line.result.token_file).toEqual({
      outcome: "read",
      sha256: createHash("sha256").update(readFileSync(ctx.tokenFile)).digest("hex"),
    });
  });

  test("with run_as the agent reads none of them and runs as that user, with its groups, no capabilities and no_new_privs", async () => {
    const { code, stdout, stderr } = await exec("isolated", `scenario: read_credentials env_name=${TOKEN_ENV}`);
    expect(code, stdout + stderr).toBe(0);
    expect(stdout).toMatch(/"state":"completed"/);
    const line = ledgerLines().findLast((l) => l.event === "credentials") as unknown as CredentialsLine;
    expect(line.result.environ).toEqual({ outcome: "EACCES" });
    expect(line.result.environ_has_name).toBeUndefined();
    expect(line.result.config).toEqual({ outcome: "EACCES" });
    expect(line.result.token_file).toBeUndefined(); // the config could not be read, so its token_file is unknown
    expect(line.identity).toMatchObject({ uid: ctx.user.uid, gid: ctx.user.gid });
    expect([...line.identity.groups].sort()).toEqual([ctx.user.gid, ctx.user.extraGid].sort());
    expect(line.identity).toMatchObject({ cap_eff: "0000000000000000", cap_prm: "0000000000000000" });
    expect(line.identity.cap_amb).toBe("0000000000000000");
    // No capability can come back (bounding set empty), and setuid/file-capability binaries gain nothing.
    expect(line.identity.cap_bnd).toBe("0000000000000000");
    expect(line.identity.no_new_privs).toBe("1");
  });

  test("a setuid-root binary run by a run_as agent runs with the agent's uid, not root (no_new_privs)", async () => {
    const runAs = ctx.config.acp.agents.find((a) => a.id === "isolated")?.runAs?.users[0];
    if (!runAs) throw new Error("isolated agent has no runAs");
    const dir = mkdtempSync(join(tmpdir(), "wc-runas-suid-"));
    try {
      chmodSync(dir, 0o755);
      const id = join(dir, "id");
      writeFileSync(id, readFileSync("/usr/bin/id"), { mode: 0o755 });
      chmodSync(id, 0o4755); // setuid root: without no_new_privs, `id -u` prints 0
      const command = setprivCommand(runAs, id, ["-u"]);
      const { stdout } = await execFileP(command.file, command.args);
      expect(stdout.trim()).toBe(String(ctx.user.uid));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("with run_as the agent cannot read the token file even when told its path", async () => {
    const { code } = await exec("isolated", `scenario: read_credentials file=${ctx.tokenFile}`);
    expect(code).toBe(0);
    const line = ledgerLines().findLast((l) => l.event === "credentials") as unknown as CredentialsLine;
    expect(line.result.file).toEqual({ outcome: "EACCES" });
  });

  test("check warns about the agent that runs as the Runner's user, not about the run_as one", async () => {
    const { stdout } = await execFileP(process.execPath, [BIN, "check", "--config", ctx.configFile]);
    expect(stdout).toContain(`agents: same, isolated (as ${ctx.user.name})`);
    expect(stdout).toContain(
      "warning: agent same runs as this Runner's user (uid 0; agents_share_runner_user = true): it can read this Runner's credentials",
    );
    expect(stdout).not.toContain("warning: agent isolated");
  });

  test("tree cleanup across the uid switch: a SIGTERM-ignoring grandchild of a run_as agent does not survive", async () => {
    const { manager } = newManager(ctx.config);
    try {
      const { run } = await runToEnd(manager, "scenario: grandchild", { provider_id: "isolated" });
      expect(run.state).toBe("completed");
      const lines = ledgerLines();
      const grandchild = lines.findLast((e) => e.event === "grandchild")?.pid as number;
      const agentPid = lines.findLast((e) => e.event === "prompt")?.pid as number;
      expect(grandchild).toBeGreaterThan(0);
      expect(alive(grandchild)).toBe(false);
      expect(groupMembers(agentPid)).toEqual([]);
    } finally {
      await manager.close();
    }
  });

  test("a hung run_as agent is killed at its deadline (lost), its group gone", async () => {
    const { manager } = newManager(ctx.config);
    try {
      const { run } = await runToEnd(manager, "scenario: hang", { provider_id: "isolated", timeout_secs: 1 });
      expect(run.state).toBe("lost");
      const agentPid = ledgerLines().findLast((e) => e.event === "prompt")?.pid as number;
      expect(alive(agentPid)).toBe(false);
      expect(groupMembers(agentPid)).toEqual([]);
    } finally {
      await manager.close();
    }
  });

  test("a non-root Runner holding the systemd unit's ambient capabilities can switch, and its agent holds none", async () => {
    // The outer setpriv plays systemd (User=<test user>, AmbientCapabilities=CAP_SETUID CAP_SETGID CAP_KILL);
    // inside it, the exact command the Runner builds for run_as prints the agent's identity.
    const runAs = ctx.config.acp.agents.find((a) => a.id === "isolated")?.runAs?.users[0];
    if (!runAs) throw new Error("isolated agent has no runAs");
    // Without CAP_SETPCAP the Runner cannot clear the bounding set; resolution says so (switchUserSupportFrom).
    const inner = setprivCommand({ ...runAs, clearBoundingSet: false }, "/bin/cat", ["/proc/self/status"]);
    const script = `cat /proc/self/status; echo ----; exec ${[inner.file, ...inner.args].map((a) => `'${a}'`).join(" ")}`;
    const { stdout } = await execFileP(runAs.setpriv, [
      `--reuid=${ctx.user.uid}`,
      `--regid=${ctx.user.gid}`,
      "--init-groups",
      "--inh-caps=+setuid,+setgid,+kill",
      "--ambient-caps=+setuid,+setgid,+kill",
      "--",
      "/bin/sh",
      "-c",
      script,
    ]);
    const [runner = "", agent = ""] = stdout.split("----\n");
    expect(switchUserSupportFrom(runner, ctx.user.uid)).toEqual({ ok: true, clearBoundingSet: false });
    expect(switchUserSupportFrom(agent, ctx.user.uid).ok).toBe(false);
    for (const set of ["CapInh", "CapPrm", "CapEff", "CapAmb"]) {
      expect(new RegExp(`^${set}:\\s*0+$`, "m").test(agent), set).toBe(true);
    }
    expect(agent).toMatch(/^NoNewPrivs:\s*1$/m);
    expect(agent).toMatch(
      new RegExp(`^Uid:\\s+${ctx.user.uid}\\s+${ctx.user.uid}\\s+${ctx.user.uid}\\s+${ctx.user.uid}$`, "m"),
    );
  });

  test("orphan reaping kills an agent group that runs as another user (start time checked)", async () => {
    const runAs = ctx.config.acp.agents.find((a) => a.id === "isolated")?.runAs?.users[0] ?? null;
    const child = await spawnAgent({
      agent: { executable: "/bin/sh", args: ["-c", "trap '' TERM; sleep 600 & sleep 600 & wait"] },
      runAs,
      cwd: "/",
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
    });
    // Both sleeps are up and every member runs as the test user.
    await poll(() => listGroupMembers(child.pgid).length >= 3, { timeoutMs: DAEMON_WAIT_MS, what: "both sleeps up" });
    const members = listGroupMembers(child.pgid);
    expect(members.length).toBe(3);
    expect(members.map((m) => uidOf(m.pid))).toEqual(members.map(() => ctx.user.uid));

    const startTime = readStartTime(child.pid);
    expect(startTime).not.toBeNull();
    const result = await reapGroup(
      { run_id: "wc_agent_run_reaptest", pgid: child.pgid, startTime: startTime as string },
      { graceMs: 200, killWaitMs: 5000 },
    );
    expect(result).toMatchObject({ outcome: "reaped", killed: true });
    expect(result.signalled).toBe(3);
    expect(listGroupMembers(child.pgid)).toEqual([]);
  });
});
