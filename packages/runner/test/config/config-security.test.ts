/**
 * Runner config rules that keep an agent inside what the operator meant
 * (issue 19 §1 and §4): project roots (`/`, `..`, two projects on one real
 * path, symlinks resolved once) and the account checks of `run_as`.
 */
import { execFile } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { pino } from "pino";
import { afterAll, describe, expect, test } from "vitest";
import { RUNNER_BIN as BIN_PATH, FAKE_AGENT_BIN } from "../../../../scripts/test-support/index.js";
import { startDaemon } from "../../src/commands/daemon.js";
import { ConfigError, parseConfig } from "../../src/config/config.js";
import { OVERFLOW_UID, resolveRunAs, switchUserSupportFrom } from "../../src/config/run-as.js";
import { openDispatchStore } from "../../src/store/open.js";

const execFileP = promisify(execFile);

const dir = mkdtempSync(join(tmpdir(), "wc-config-sec-"));
mkdirSync(join(dir, "proj", "sub"), { recursive: true });
mkdirSync(join(dir, "other"));
symlinkSync(join(dir, "proj"), join(dir, "proj-link"));
symlinkSync("/", join(dir, "slash-link"));
symlinkSync("/etc", join(dir, "etc-link"));
mkdirSync(join(dir, "bin"));
writeFileSync(join(dir, "bin", "agent"), "#!/bin/sh\n");
chmodSync(join(dir, "bin", "agent"), 0o755);
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const file = join(dir, "runner.toml");

function configText(projects: { id: string; root: string }[], agentExtra = "", acpExtra = ""): string {
  return [
    ...projects.flatMap((p) => ["[[projects]]", `id = "${p.id}"`, `root = ${JSON.stringify(p.root)}`]),
    "[acp]",
    acpExtra,
    "[[acp.agents]]",
    'id = "fake"',
    'executable = "bin/agent"',
    agentExtra,
  ].join("\n");
}

function errorsOf(text: string): string[] {
  try {
    parseConfig(text, file);
  } catch (error) {
    if (error instanceof ConfigError) return [...error.errors];
    throw error;
  }
  throw new Error("config was accepted");
}

describe("project roots", () => {
  test("the filesystem root is refused, also through a symlink", () => {
    expect(errorsOf(configText([{ id: "all", root: "/" }]))).toEqual([
      `${file}: projects[0].root: / resolves to / (a project root must be a project's directory)`,
    ]);
    expect(errorsOf(configText([{ id: "all", root: "slash-link" }]))).toEqual([
      `${file}: projects[0].root: ${join(dir, "slash-link")} resolves to / (a project root must be a project's directory)`,
    ]);
  });

  test("a root with a '..' segment is refused, even when it resolves to a directory", () => {
    expect(errorsOf(configText([{ id: "up", root: "proj/sub/.." }]))).toEqual([
      `${file}: projects[0].root: must not contain '..' segments (name the directory itself)`,
    ]);
    expect(errorsOf(configText([{ id: "up", root: `${dir}/other/../proj` }]))).toEqual([
      `${file}: projects[0].root: must not contain '..' segments (name the directory itself)`,
    ]);
  });

  test("two projects on the same real path are refused (a symlink does not make another directory)", () => {
    expect(
      errorsOf(
        configText([
          { id: "a", root: "proj" },
          { id: "b", root: "proj-link" },
        ]),
      ),
    ).toEqual([`${file}: projects[1].root: is the same directory as project "a" (${join(dir, "proj")})`]);
  });

  test("symlinks are resolved once, at load, and the real path is recorded", () => {
    const config = parseConfig(configText([{ id: "a", root: "proj-link" }]), file);
    expect(config.projects[0]?.root).toBe(join(dir, "proj"));
  });

  test("a root in a system tree is refused, also through a symlink", () => {
    for (const [root, tree] of [
      ["/etc", "/etc"],
      ["/etc/ssl", "/etc"],
      ["/proc/sys", "/proc"],
      ["/sys/kernel", "/sys"],
      ["/dev", "/dev"],
      ["/boot", "/boot"],
      ["/root", "/root"],
      ["etc-link", "/etc"],
    ] as const) {
      expect(errorsOf(configText([{ id: "sys", root }]))).toEqual([
        `${file}: projects[0].root: project "sys": ${root === "etc-link" ? "/etc" : root} is in the system tree ${tree} (a project root must be a project's directory)`,
      ]);
    }
  });

  test("a root that holds the Runner's config file, token file or CA file is refused", () => {
    expect(errorsOf(configText([{ id: "here", root: "." }]))).toEqual([
      `${file}: projects[0].root: project "here": ${dir} holds the Runner's config file's directory ${dir}; an agent working there could rewrite the Runner's config — keep the config outside every project root`,
      // The default state_dir (.webcodex/runner) is inside the config's directory too.
      `${file}: projects[0].root: project "here": ${dir} holds the Runner's state directory (runner.state_dir, ${join(dir, ".webcodex/runner")}); an agent working there could read or rewrite the Runner's records — keep runner.state_dir and every project root apart`,
    ]);
    const server = (key: string, f: string) =>
      `[server]\nurl = "ws://127.0.0.1:9/runner"\ntoken_env = "T"\n${key} = ${JSON.stringify(f)}\n`;
    expect(errorsOf(server("ca_file", "proj/ca.pem") + configText([{ id: "p", root: "proj" }]))).toContain(
      `${file}: projects[0].root: project "p": ${join(dir, "proj")} holds the Runner's server.ca_file (${join(dir, "proj/ca.pem")}); an agent working there could read or replace it — keep it outside every project root`,
    );
    const tokenInRoot = `[server]\nurl = "ws://127.0.0.1:9/runner"\ntoken_file = "proj/runner.token"\n${configText([{ id: "p", root: "proj" }])}`;
    expect(errorsOf(tokenInRoot)).toEqual([
      `${file}: projects[0].root: project "p": ${join(dir, "proj")} holds the Runner's server.token_file (${join(dir, "proj/runner.token")}); an agent working there could read or replace it — keep it outside every project root`,
    ]);
    // A root inside the config's directory (the usual layout) is fine.
    expect(parseConfig(configText([{ id: "p", root: "proj" }]), file).projects[0]?.root).toBe(join(dir, "proj"));
  });

  test("a root that is, holds or lies in the state directory is refused, whether or not it exists yet", () => {
    const withState = (stateDir: string, root: string) =>
      `[runner]\nstate_dir = ${JSON.stringify(stateDir)}\n${configText([{ id: "p", root }])}`;
    const rule = (root: string, how: string, state: string) =>
      `${file}: projects[0].root: project "p": ${root} ${how} the Runner's state directory (runner.state_dir, ${state}); an agent working there could read or rewrite the Runner's records — keep runner.state_dir and every project root apart`;
    expect(errorsOf(withState("proj", "proj"))).toEqual([rule(join(dir, "proj"), "is", join(dir, "proj"))]);
    expect(errorsOf(withState("proj/not-yet/state", "proj"))).toEqual([
      rule(join(dir, "proj"), "holds", join(dir, "proj/not-yet/state")),
    ]);
    expect(errorsOf(withState("proj-link/.state", "proj"))).toEqual([
      rule(join(dir, "proj"), "holds", join(dir, "proj/.state")),
    ]);
    expect(errorsOf(withState("proj", "proj/sub"))).toEqual([
      rule(join(dir, "proj/sub"), "is inside", join(dir, "proj")),
    ]);
  });

  test("nested roots are refused, naming both projects, in either order", () => {
    const nested = `${file}: projects[1].root: project "b" and project "a" nest: project "b"'s root ${join(dir, "proj/sub")} is inside project "a"'s root ${join(dir, "proj")} (each project needs its own directory tree)`;
    expect(
      errorsOf(
        configText([
          { id: "a", root: "proj" },
          { id: "b", root: "proj/sub" },
        ]),
      ),
    ).toEqual([nested]);
    expect(
      errorsOf(
        configText([
          { id: "b", root: "proj/sub" },
          { id: "a", root: "proj-link" },
        ]),
      ),
    ).toEqual([
      `${file}: projects[1].root: project "a" and project "b" nest: project "b"'s root ${join(dir, "proj/sub")} is inside project "a"'s root ${join(dir, "proj")} (each project needs its own directory tree)`,
    ]);
    // Siblings and names sharing a prefix do not nest.
    mkdirSync(join(dir, "proj2"), { recursive: true });
    const ok = parseConfig(
      configText([
        { id: "a", root: "proj" },
        { id: "b", root: "proj2" },
        { id: "c", root: "other" },
      ]),
      file,
    );
    expect(ok.projects.map((p) => p.id)).toEqual(["a", "b", "c"]);
  });

  test("webcodex-runner check and run refuse a state directory inside a project root", async () => {
    const configFile = join(dir, "state-in-root.toml");
    writeFileSync(
      configFile,
      [
        "[runner]",
        'state_dir = "proj/.webcodex"',
        "[server]",
        'url = "ws://127.0.0.1:9/runner"',
        'token_env = "WEBCODEX_RUNNER_TOKEN"',
        configText([{ id: "p", root: "proj" }]),
      ].join("\n"),
      { mode: 0o600 },
    );
    for (const command of ["check", "run"]) {
      const refused = await execFileP(process.execPath, [BIN_PATH, command, "--config", configFile], {
        env: { PATH: process.env.PATH ?? "", WEBCODEX_RUNNER_TOKEN: "t0ken-not-used" },
      }).then(
        () => null,
        (e: { code?: number; stderr?: string }) => e,
      );
      expect(refused?.code).toBe(2);
      expect(refused?.stderr).toContain(
        `projects[0].root: project "p": ${join(dir, "proj")} holds the Runner's state directory (runner.state_dir, ${join(dir, "proj/.webcodex")})`,
      );
    }
    expect(() => statSync(join(dir, "proj/.webcodex"))).toThrow(); // nothing was created
  });

  test("names that merely contain dots are fine", () => {
    mkdirSync(join(dir, "x..y"), { recursive: true });
    const config = parseConfig(configText([{ id: "a", root: "x..y" }]), file);
    expect(config.projects[0]?.root).toBe(join(dir, "x..y"));
  });
});

describe("run_as accounts", () => {
  const project = [{ id: "p", root: "proj" }];

  test("an agent without run_as runs as the Runner's user (runAs null)", () => {
    expect(parseConfig(configText(project), file).acp.agents[0]?.runAs).toBeNull();
  });

  test("an unknown user, a group without a user, root and malformed names are refused by key", () => {
    expect(errorsOf(configText(project, 'run_as = "wc-no-such-user-xyz"'))).toEqual([
      `${file}: acp.agents[0].run_as: "wc-no-such-user-xyz": no such user`,
    ]);
    expect(errorsOf(configText(project, 'run_as_group = "root"'))).toEqual([
      `${file}: acp.agents[0].run_as_group: needs run_as (the user the agent runs as)`,
    ]);
    expect(errorsOf(configText(project, 'run_as = "root"'))).toEqual([
      `${file}: acp.agents[0].run_as: "root" is root (uid 0); name an unprivileged user`,
    ]);
    expect(errorsOf(configText(project, 'run_as = "bad name;"'))).toEqual([
      `${file}: acp.agents[0].run_as: must be a user or group name (^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$)`,
    ]);
    expect(errorsOf(configText(project, 'run_as = "daemon"\nrun_as_group = "wc-no-such-group-xyz"'))).toEqual([
      `${file}: acp.agents[0].run_as_group: "wc-no-such-group-xyz": no such group`,
    ]);
  });

  test("a pool is an array of distinct user names; each member is checked under its own index", () => {
    const rule = "must be a user name or an array of 1 to 64 user names";
    expect(errorsOf(configText(project, "run_as = 5"))).toEqual([`${file}: acp.agents[0].run_as: ${rule}`]);
    expect(errorsOf(configText(project, 'run_as = { pool = ["daemon"] }'))).toEqual([
      `${file}: acp.agents[0].run_as: ${rule}`,
    ]);
    expect(errorsOf(configText(project, "run_as = []"))).toEqual([
      `${file}: acp.agents[0].run_as: must name at least one user`,
    ]);
    const many = JSON.stringify(Array.from({ length: 65 }, (_, i) => `wc-pool-${i}`));
    expect(errorsOf(configText(project, `run_as = ${many}`))).toEqual([
      `${file}: acp.agents[0].run_as: must name at most 64 users`,
    ]);
    expect(errorsOf(configText(project, 'run_as = ["daemon", "bin", "daemon"]'))).toEqual([
      `${file}: acp.agents[0].run_as[2]: "daemon" is listed twice`,
    ]);
    expect(errorsOf(configText(project, 'run_as = ["daemon", "bad name;"]'))).toEqual([
      `${file}: acp.agents[0].run_as[1]: must be a user or group name (^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$)`,
    ]);
    expect(errorsOf(configText(project, 'run_as = ["daemon", "wc-no-such-user-xyz"]'))).toEqual([
      `${file}: acp.agents[0].run_as[1]: "wc-no-such-user-xyz": no such user`,
    ]);
    expect(errorsOf(configText(project, 'run_as = ["daemon", "root"]'))).toEqual([
      `${file}: acp.agents[0].run_as[1]: "root" is root (uid 0); name an unprivileged user`,
    ]);
  });

  test("users whose every process the sweep would kill wrongly are refused: the overflow user, the Runner's own", () => {
    const nobody = resolveRunAs("nobody", undefined, () => ({ ok: true, clearBoundingSet: true }), 1000);
    expect(nobody).toEqual({
      ok: false,
      key: "run_as",
      reason: `"nobody" is the overflow user (uid ${OVERFLOW_UID}), shared by other services; every process of a run_as user is killed after each run, so name users of this Runner's own`,
    });
    const own = resolveRunAs(["bin", "daemon"], undefined, () => ({ ok: true, clearBoundingSet: true }), 1);
    expect(own).toEqual({
      ok: false,
      key: "run_as[1]",
      reason: `"daemon" is this Runner's own user (uid 1); every process of a run_as user is killed after each run, so name another user (or omit run_as)`,
    });
    const pool = resolveRunAs(["bin", "daemon"], undefined, () => ({ ok: true, clearBoundingSet: false }), 1000);
    expect(pool.ok && pool.value?.users.map((u) => [u.user, u.uid, u.clearBoundingSet])).toEqual([
      ["bin", 2, false],
      ["daemon", 1, false],
    ]);
  });
});

describe("switching users needs root or ambient CAP_SETUID/CAP_SETGID plus CAP_KILL", () => {
  const status = (eff: string, amb: string) =>
    `Name:\tnode\nCapInh:\t0000000000000000\nCapPrm:\t${eff}\nCapEff:\t${eff}\nCapBnd:\t000001ffffffffff\nCapAmb:\t${amb}\n`;
  const FULL = "000001ffffffffff";
  const NONE = "0000000000000000";
  // CAP_KILL = 5, CAP_SETGID = 6, CAP_SETUID = 7 → 0x20 + 0x40 + 0x80.
  const SYSTEMD = "00000000000000e0";

  test.each([
    ["root with every capability", FULL, NONE, 0, true],
    ["root without CAP_SETUID (e.g. a restricted container)", "000001ffffffff7f", NONE, 0, false],
    ["a non-root Runner with the systemd unit's ambient capabilities", SYSTEMD, SYSTEMD, 1000, true],
    ["a non-root Runner with them and CAP_SETPCAP ambient", "00000000000001e0", "00000000000001e0", 1000, true],
    [
      "a non-root Runner with them effective but not ambient (setpriv would not inherit them)",
      SYSTEMD,
      NONE,
      1000,
      false,
    ],
    ["a non-root Runner without CAP_KILL", "00000000000000c0", "00000000000000c0", 1000, false],
    ["a plain user", NONE, NONE, 1000, false],
  ])("%s", (_name, eff, amb, euid, ok) => {
    const result = switchUserSupportFrom(status(eff, amb), euid);
    expect(result.ok).toBe(ok);
    // setpriv can clear the agent's bounding set only holding CAP_SETPCAP (bit 8): root, or ambient.
    if (result.ok) expect(result.clearBoundingSet).toBe(euid === 0 || amb === "00000000000001e0");
    if (!result.ok) expect(result.reason).toMatch(/CAP_(SETUID|SETGID|KILL)/);
  });

  test("the refusal names what is missing and how to grant it", () => {
    expect(switchUserSupportFrom(status(NONE, NONE), 1000)).toEqual({
      ok: false,
      reason:
        "this Runner (uid 1000) lacks ambient CAP_SETUID, ambient CAP_SETGID, CAP_KILL; run it as root or with AmbientCapabilities=CAP_SETUID CAP_SETGID CAP_KILL (examples/systemd/webcodex-runner.service)",
    });
  });
});

describe("credential file modes and same-user agents (check, daemon start)", () => {
  const BIN = BIN_PATH;

  test("check warns about an agent running as the Runner's user and about group/other-readable credential files", async () => {
    const configFile = join(dir, "modes.toml");
    const tokenFile = join(dir, "modes.token");
    writeFileSync(tokenFile, "t0ken\n", { mode: 0o644 });
    chmodSync(tokenFile, 0o644);
    const text = [
      "[runner]",
      'state_dir = "modes-state"',
      "[server]",
      'url = "ws://127.0.0.1:9/runner"',
      'token_file = "modes.token"',
      configText([{ id: "p", root: "proj" }], "", "agents_share_runner_user = true"),
    ].join("\n");
    writeFileSync(configFile, text);
    chmodSync(configFile, 0o640);
    mkdirSync(join(dir, "modes-state"), { mode: 0o755 });
    chmodSync(join(dir, "modes-state"), 0o755);
    const { stdout } = await execFileP(process.execPath, [BIN, "check", "--config", configFile]);
    expect(stdout).toContain(
      `warning: agent fake runs as this Runner's user (uid ${process.getuid?.()}; agents_share_runner_user = true): ` +
        "it can read this Runner's credentials (its environment, config and token file) and stop it, then take over its link",
    );
    expect(stdout).toContain(
      `warning: runner.state_dir ${join(dir, "modes-state")} has mode 0755: other users can read it; chmod 700 it`,
    );
    expect(stdout).toContain(`warning: config file ${configFile} has mode 0640: other users can read it; chmod 600 it`);
    expect(stdout).toContain(
      `warning: server.token_file ${tokenFile} has mode 0644: other users can read it; chmod 600 it`,
    );

    chmodSync(configFile, 0o600);
    chmodSync(tokenFile, 0o600);
    chmodSync(join(dir, "modes-state"), 0o700);
    const quiet = await execFileP(process.execPath, [BIN, "check", "--config", configFile]);
    expect(quiet.stdout).not.toMatch(/warning: (runner\.state_dir|config file|server\.token_file)/);
  });

  test("the dispatch store creates its state dir 0700", () => {
    const stateDir = join(dir, "fresh-state", "nested");
    openDispatchStore({ stateDir }).store.close();
    expect(statSync(stateDir).mode & 0o777).toBe(0o700);
  });
});

describe("agents that would run as the Runner's own user (issue 25 §2)", () => {
  /** `run` and `check` of a config with two agents without run_as; the token is set so only the rule can refuse. */
  async function runnerCli(command: "run" | "check", acpExtra: string) {
    const configFile = join(dir, `shared-${command}-${acpExtra === "" ? "plain" : "opted"}.toml`);
    const text = [
      "[runner]",
      `state_dir = ${JSON.stringify(`shared-${command}-state`)}`,
      "[server]",
      'url = "ws://127.0.0.1:9/runner"',
      'token_env = "WC_SHARED_TEST_TOKEN"',
      configText([{ id: "p", root: "proj" }], "", acpExtra),
      "[[acp.agents]]",
      'id = "second"',
      'executable = "bin/agent"',
    ].join("\n");
    writeFileSync(configFile, text, { mode: 0o600 });
    try {
      const { stdout, stderr } = await execFileP(process.execPath, [BIN_PATH, command, "--config", configFile], {
        env: { ...process.env, WC_SHARED_TEST_TOKEN: "t0ken-for-the-shared-user-test" },
        timeout: 30_000,
      });
      return { code: 0, stdout, stderr, configFile };
    } catch (error) {
      const e = error as { code: number; stdout: string; stderr: string };
      return { code: e.code, stdout: e.stdout, stderr: e.stderr, configFile };
    }
  }

  test.each(["run", "check"] as const)(
    "%s refuses (exit 2) without agents_share_runner_user, naming the agents and both ways out",
    async (command) => {
      const { code, stdout, stderr, configFile } = await runnerCli(command, "");
      expect(code).toBe(2);
      expect(stdout).not.toContain("config OK");
      expect(stderr).toContain(
        `${configFile}: acp.agents_share_runner_user: agents fake, second would run as this Runner's own OS user (uid ${process.getuid?.()})`,
      );
      expect(stderr).toContain("Either set run_as");
      expect(stderr).toContain("opt in with [acp] agents_share_runner_user = true");
      expect(stderr).not.toContain("runner started");
    },
  );

  test("with the opt-in the daemon states the consequence once at start, naming the agents", async () => {
    const configFile = join(dir, "shared-daemon.toml");
    writeFileSync(
      configFile,
      [
        "[runner]",
        'state_dir = "shared-daemon-state"',
        "[server]",
        'url = "ws://127.0.0.1:9/runner"',
        'token_env = "WC_SHARED_DAEMON_TOKEN"',
        configText([{ id: "p", root: "proj" }], "", "agents_share_runner_user = true"),
      ].join("\n"),
      { mode: 0o600 },
    );
    process.env.WC_SHARED_DAEMON_TOKEN = "t0ken-for-the-shared-daemon-test";
    const lines: Record<string, unknown>[] = [];
    const logger = pino({ level: "info" }, { write: (line: string) => lines.push(JSON.parse(line)) });
    try {
      const daemon = await startDaemon({
        configPath: configFile,
        newStore: false,
        logger,
        handleSignals: false,
        exitOnFatal: false,
      });
      await daemon.stop();
    } finally {
      delete process.env.WC_SHARED_DAEMON_TOKEN;
    }
    const stated = lines.filter((l) => String(l.msg).startsWith("agents_share_runner_user = true:"));
    expect(stated).toEqual([expect.objectContaining({ level: 40, agents: ["fake"] })]);
    expect(String(stated[0]?.msg)).toContain("can read this Runner's credentials");
    expect(String(stated[0]?.msg)).toContain("take over its link to the Server");
  });

  test("without the opt-in startDaemon refuses before opening the store", async () => {
    const configFile = join(dir, "shared-refused.toml");
    writeFileSync(
      configFile,
      configText([{ id: "p", root: "proj" }]).replace(
        "[[projects]]",
        '[runner]\nstate_dir = "shared-refused-state"\n[[projects]]',
      ),
      { mode: 0o600 },
    );
    await expect(
      startDaemon({ configPath: configFile, newStore: false, handleSignals: false, exitOnFatal: false }),
    ).rejects.toMatchObject({
      exitCode: 2,
      message: expect.stringContaining("acp.agents_share_runner_user: agent fake"),
    });
    expect(() => statSync(join(dir, "shared-refused-state"))).toThrow();
  });
});

test("the daemon logs a warning at start for each credential file others can access (setting and mode, not the path)", async () => {
  const configFile = join(dir, "daemon.toml");
  const tokenFile = join(dir, "daemon.token");
  writeFileSync(tokenFile, "t0ken\n");
  chmodSync(tokenFile, 0o604);
  writeFileSync(
    configFile,
    [
      "[runner]",
      'state_dir = "daemon-state"',
      "[server]",
      'url = "ws://127.0.0.1:9/runner"',
      'token_file = "daemon.token"',
      configText([{ id: "p", root: "proj" }], "", "agents_share_runner_user = true"),
    ].join("\n"),
  );
  chmodSync(configFile, 0o600);
  const lines: Record<string, unknown>[] = [];
  const logger = pino({ level: "info" }, { write: (line: string) => lines.push(JSON.parse(line)) });
  const daemon = await startDaemon({
    configPath: configFile,
    newStore: false,
    logger,
    handleSignals: false,
    exitOnFatal: false,
  });
  await daemon.stop();
  const warnings = lines.filter((l) => l.msg === "a Runner credential file is accessible to other users; chmod it");
  expect(warnings).toEqual([expect.objectContaining({ setting: "server.token_file", mode: "0604", want: "0600" })]);
  expect(JSON.stringify(warnings)).not.toContain(dir);
  expect(statSync(join(dir, "daemon-state")).mode & 0o777).toBe(0o700);
});

test("check --probe prints what the agent says about itself terminal-safe", async () => {
  const configFile = join(dir, "probe.toml");
  const name = "evil\u001b]0;pwned\u0007\u001b[2Jname\u202e";
  writeFileSync(
    configFile,
    [
      "[[projects]]",
      'id = "p"',
      'root = "proj"',
      "[acp]",
      "agents_share_runner_user = true",
      "[[acp.agents]]",
      'id = "fake"',
      `executable = ${JSON.stringify(FAKE_AGENT_BIN)}`,
      `args = ${JSON.stringify(["--agent-name", name])}`,
      "[acp.agents.env_from_env]",
      'PATH = "PATH"',
    ].join("\n"),
  );
  const { stdout } = await execFileP(process.execPath, [BIN_PATH, "check", "--config", configFile, "--probe", "fake"]);
  expect(stdout).toContain("agent: evilname ");
  // biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
  expect(stdout).not.toMatch(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/);
});
