/**
 * A recorded run's terminal entry and the mark that says it was written (`terminal_recorded`) commit
 * together. Before, the mark committed first: an append that failed, or a crash between the two, left
 * the run marked with no terminal entry, and the start-up catch-up (which redoes unmarked runs only)
 * never wrote it; a reader could also see the mark before the entry. The Server's StateStore on the pass's
 * state engine (support/test-state.ts), the listener the Server installs (SessionService), a failed append
 * injected once.
 */
import { pino } from "pino";
import { afterEach, describe, expect, it, vi } from "vitest";
import { SessionService } from "../../src/sessions/service.js";
import { SessionStore } from "../../src/sessions/store.js";
import type { StateStore } from "../../src/state/store.js";
import { openTestState } from "../support/test-state.js";

afterEach(() => {
  vi.restoreAllMocks();
});

const RUN = "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa";
const quiet = pino({ level: "silent" });

async function open() {
  const { store: state } = await openTestState();
  const sessions = new SessionStore(state.engine);
  await sessions.insertSession({ session_id: "s1", principal_id: "alice", project_id: "demo", title: "s1" });
  await state.insert({
    run_id: RUN,
    principal_id: "alice",
    project_id: "demo",
    provider_id: "fake",
    runner_id: "r1",
    intent_fingerprint: "f".repeat(64),
    agent_instance_id: "ai_1",
    provider_instance_id: "pi_1",
    store_id: "st_1",
    admission: "admitted",
    state: "running",
    execution_state: "started",
    stop_reason: null,
    failure_kind: null,
    recovery_kind: "wait",
    message: null,
  });
  await sessions.linkRun(RUN, "s1");
  return { state, sessions };
}

const terminalEntries = async (sessions: SessionStore) =>
  (await sessions.evidenceAfter("s1", 0, 100)).filter((e) => e.kind === "coding_agent_terminal" && e.run_id === RUN);

/** A Server's session service, started as the Server starts it. */
async function started(sessions: SessionStore, state: StateStore): Promise<SessionService> {
  const service = new SessionService(sessions, state, quiet);
  await service.start();
  return service;
}

describe("a recorded run's terminal evidence", () => {
  it("is written with its mark: a failed append leaves the run unmarked, and the catch-up writes it once", async () => {
    const { state, sessions } = await open();
    const first = await started(sessions, state);
    vi.spyOn(sessions, "appendEvidence").mockImplementationOnce(() => Promise.reject(new Error("disk I/O error")));

    await state.update(RUN, { state: "completed", execution_state: "completed", stop_reason: "end_turn" });
    await first.settled();
    expect(await terminalEntries(sessions)).toHaveLength(0);
    expect((await sessions.recorderOf(RUN))?.terminal_recorded).toBe(0);

    // A restarted Server: its catch-up finds the unmarked terminal run and writes the entry.
    await started(sessions, state);
    expect(await terminalEntries(sessions)).toHaveLength(1);
    expect((await sessions.recorderOf(RUN))?.terminal_recorded).toBe(1);
    await started(sessions, state);
    expect(await terminalEntries(sessions)).toHaveLength(1);
  });

  it("is written once when the run ends normally", async () => {
    const { state, sessions } = await open();
    const service = await started(sessions, state);
    await state.update(RUN, { state: "failed", execution_state: "outcome_unknown", failure_kind: "provider_exited" });
    await state.update(RUN, { state: "lost" });
    await service.settled();
    expect(await terminalEntries(sessions)).toHaveLength(1);
    expect((await sessions.recorderOf(RUN))?.terminal_recorded).toBe(1);
  });
});
