/** run.start admission: fences, project rules, idempotent replay and conflicts, inventory. */
import { afterAll, describe, expect, test } from "vitest";
import { makeWorkspace, newManager, startRequest, writeConfig } from "../support/harness.js";

const ws = makeWorkspace();
const { manager } = newManager(writeConfig(ws));
const readOnly = newManager(writeConfig(ws, { allowPatch: false })).manager;
afterAll(async () => {
  await manager.close();
  await readOnly.close();
  ws.cleanup();
});

describe("admission", () => {
  test.each([
    ["stale_runner", { agent_instance_id: "ai_someoneelse000000000" }],
    ["stale_provider", { provider_instance_id: "pi_someoneelse000000000" }],
    ["unknown_provider", { provider_id: "nope" }],
    ["unknown_project", { project_id: "nope" }],
  ] as const)("rejects %s before admission", async (code, overrides) => {
    const request = startRequest(manager, "scenario: hello", overrides);
    expect(await manager.start(request)).toMatchObject({ ok: false, code });
    expect(manager.sync(request.run_id, 0, 10)).toBeNull();
  });

  test("rejects a project without allow_patch", async () => {
    expect(await readOnly.start(startRequest(readOnly, "scenario: hello"))).toMatchObject({
      ok: false,
      code: "project_not_writable",
    });
  });

  test("same run_id: same fingerprint replays, a different one conflicts; inventory lists it", async () => {
    const request = startRequest(manager, "scenario: hello\ncase: replay");
    const first = await manager.start(request);
    expect(first).toMatchObject({
      ok: true,
      created: true,
      run: { state: "starting", execution_state: "not_started" },
    });
    expect(await manager.start(request)).toMatchObject({ ok: true, created: false });
    const conflict = await manager.start({ ...request, intent_fingerprint: "0".repeat(64) });
    expect(conflict).toMatchObject({ ok: false, code: "idempotency_conflict", run: { run_id: request.run_id } });
    await manager.whenSettled(request.run_id);
    expect(await manager.start(request)).toMatchObject({ ok: true, created: false, run: { state: "completed" } });
    expect(manager.inventory().map((r) => r.run_id)).toContain(request.run_id);
    expect(manager.helloBody()).toMatchObject({
      agent_instance_id: manager.agentInstanceId,
      capabilities: { coding_agent_run: { max_concurrent_runs: 4 } },
      providers: [{ provider_id: "fake", name: "fake", allowed_config_options: [] }],
      projects: [{ project_id: "demo", allow_patch: true }],
    });
  });
});

describe("continuation admission (design §17)", () => {
  test("a parent whose ACP session this store does not hold: admitted, then failed/not_started before any spawn", async () => {
    const parent = startRequest(manager, "scenario: hello\ncase: parent");
    const child = startRequest(manager, "scenario: hello\ncase: orphan", { continue_run_id: parent.run_id });
    expect(await manager.start(child)).toMatchObject({ ok: true, created: true });
    await manager.whenSettled(child.run_id);
    expect(manager.inventory().find((r) => r.run_id === child.run_id)).toMatchObject({
      state: "failed",
      execution_state: "not_started",
      failure_kind: "provider_rejected",
      message: expect.stringContaining("holds no agent session of the run to continue"),
    });
  });

  test("a parent that ran here: its session id is kept and the child takes it up", async () => {
    const parent = startRequest(manager, "scenario: hello\ncase: kept");
    await manager.start(parent);
    await manager.whenSettled(parent.run_id);
    expect(manager.inventory().find((r) => r.run_id === parent.run_id)?.state).toBe("completed");
    // The fake agent here advertises neither method: the child gets as far as the session step.
    const child = startRequest(manager, "scenario: hello\ncase: child", { continue_run_id: parent.run_id });
    await manager.start(child);
    await manager.whenSettled(child.run_id);
    expect(manager.inventory().find((r) => r.run_id === child.run_id)).toMatchObject({
      state: "failed",
      execution_state: "not_started",
      failure_kind: "provider_rejected",
      message: expect.stringContaining("neither session/resume nor session/load"),
    });
  });
});
