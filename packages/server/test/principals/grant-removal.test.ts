/**
 * Authority narrows with configuration: a principal whose project grant is
 * removed from the Server config loses observe and cancel on that project's
 * runs — its own runs included — once the Server restarts on the new config.
 * Real `webcodex-server` child process restarted between the two configs, a
 * real Runner daemon and the fake agent (whose ledger shows no cancel arrived).
 */
import { readFileSync, writeFileSync } from "node:fs";
import { isTerminalState } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import type { StartInput } from "../../src/runs/api.js";
import { okValue, ProcStack } from "../support/proc-stack.js";

/** Long enough to still be running after two Server restarts; cancelled at the end. */
const LONG = "scenario: slow interval_ms=500 count=600";

function input(key: string, project: string): StartInput {
  return { project_id: project, provider_id: "fake", idempotency_key: key, prompt: LONG };
}

/** Rewrites alice's `projects = [...]` line in the Server config. */
function setAliceProjects(s: ProcStack, projects: string[]): void {
  const text = readFileSync(s.serverConfigFile, "utf8");
  const next = text.replace(/(id = "alice"\nscopes = [^\n]*\nprojects = )[^\n]*/, `$1${JSON.stringify(projects)}`);
  if (next === text) throw new Error("alice's projects line not found in the server config");
  writeFileSync(s.serverConfigFile, next);
}

async function restartServer(s: ProcStack): Promise<void> {
  await s.killServer("SIGTERM");
  await s.startServer();
  // bob keeps every grant: his view says when the Runner is linked again.
  await poll(async () => (await s.projects("bob")).every((p) => p.runner_online), {
    timeoutMs: DAEMON_WAIT_MS,
    intervalMs: DAEMON_POLL_MS,
    what: "runner back online",
  });
}

const cancelLines = (s: ProcStack) =>
  readFileSync(s.ledgerFile("r1"), "utf8")
    .split("\n")
    .filter((l) => l.includes('"event":"cancel"')).length;

describe("project grant removed from the config", { timeout: 90_000 }, () => {
  let s: ProcStack | undefined;
  afterEach(async () => {
    await s?.stop();
    s = undefined;
  });

  it("loses observe and cancel on that project's runs after a Server restart, and keeps them on other projects", async () => {
    s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo", "other"] }], server: "child" }).init();
    await s.startRunner("r1");
    const onDemo = okValue(await s.start("alice", input("grant-demo", "demo")));
    const onOther = okValue(await s.start("alice", input("grant-other", "other")));
    await poll(
      async () => {
        const a = okValue(await s!.observe("alice", { run_id: onDemo.run_id }));
        const b = okValue(await s!.observe("alice", { run_id: onOther.run_id }));
        return a.state === "running" && b.state === "running";
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "both runs running" },
    );

    setAliceProjects(s, ["other"]);
    await restartServer(s);

    // The demo run is alice's own, but her grant on demo is gone: it looks exactly like no run.
    expect(await s.observe("alice", { run_id: onDemo.run_id })).toMatchObject({
      ok: false,
      error: { code: "not_found" },
    });
    expect(
      await s.observe("alice", { run_id: onDemo.run_id, after_observation_token: onDemo.observation_token }),
    ).toMatchObject({ ok: false, error: { code: "not_found" } });
    expect(await s.cancel("alice", { run_id: onDemo.run_id })).toMatchObject({
      ok: false,
      error: { code: "not_found" },
    });
    // A start on the project is refused too, even replaying the same key.
    expect((await s.start("alice", input("grant-demo", "demo"))).ok).toBe(false);
    // The grant she kept still works.
    expect(okValue(await s.observe("alice", { run_id: onOther.run_id })).state).toBe("running");
    expect(cancelLines(s)).toBe(0);

    // Restoring the grant restores access to the same run: the refusal was the grant, not the restart.
    setAliceProjects(s, ["demo", "other"]);
    await restartServer(s);
    const back = okValue(await s.observe("alice", { run_id: onDemo.run_id }));
    expect(back.state).toBe("running");
    for (const run of [onDemo, onOther]) {
      expect(okValue(await s.cancel("alice", { run_id: run.run_id }))).toMatchObject({
        run_id: run.run_id,
        cancel_requested: true,
        already_terminal: false,
      });
    }
    await poll(
      async () => {
        const a = okValue(await s!.observe("alice", { run_id: onDemo.run_id }));
        const b = okValue(await s!.observe("alice", { run_id: onOther.run_id }));
        return isTerminalState(a.state) && isTerminalState(b.state);
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "both runs terminal" },
    );
    expect(cancelLines(s)).toBe(2);
    expect(s.prompts("r1")).toHaveLength(2);
  });
});
