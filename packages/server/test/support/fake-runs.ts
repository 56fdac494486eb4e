/**
 * A small in-memory RunsApi for unit tests of the MCP layer (schemas,
 * authority, audit, HTTP plumbing). It is NOT the run core: acceptance tests
 * use the real Server + Runner (see stack.ts). Like the run core it decides authority first, with the
 * same refusals (principals/authority.ts), since the tools above it no longer check.
 */
import { createHash } from "node:crypto";
import type { RunApply, RunChanges, RunEvent, RunState } from "@webcodex/protocol";
import { missingScopes, startRefusal, TOOL_SCOPE } from "../../src/principals/authority.js";
import type {
  ApiResult,
  CancelOutput,
  ObserveInput,
  ObserveOutput,
  Principal,
  ProjectView,
  RunsApi,
  StartCallHooks,
  StartInput,
  StartOutput,
} from "../../src/runs/api.js";

interface FakeRun {
  run_id: string;
  principal_id: string;
  project_id: string;
  state: RunState;
  events: RunEvent[];
  fingerprint: string;
}

export class FakeRuns implements RunsApi {
  /** `firstMessage`: the text of the one agent_message every started run has. */
  constructor(private readonly firstMessage = "hello") {}
  readonly runs = new Map<string, FakeRun>();
  readonly startCalls: StartInput[] = [];
  projects: ProjectView[] = [
    {
      project_id: "demo",
      runner_online: true,
      allow_patch: true,
      agents_share_runner_user: false,
      providers: [{ provider_id: "fake", name: "Fake agent", allowed_config_options: ["model"] }],
    },
    { project_id: "other", runner_online: true, allow_patch: true, agents_share_runner_user: false, providers: [] },
  ];
  /** Resolves a pending observe; set by observe() while waiting. */
  #wakers = new Set<() => void>();

  async start(principal: Principal, input: StartInput, hooks: StartCallHooks = {}): Promise<ApiResult<StartOutput>> {
    const denied = startRefusal(principal, input.project_id, "Starting a coding agent");
    if (denied) return { ok: false, error: denied };
    if (hooks.prepare) {
      const prepared = await hooks.prepare();
      if (!prepared.ok) return prepared;
      input = { ...input, prompt: prepared.value.prompt };
    }
    this.startCalls.push(input);
    const project = this.projects.find((p) => p.project_id === input.project_id);
    if (!project) return { ok: false, error: { code: "not_found", message: "no such project", recovery_kind: "none" } };
    if (!project.providers.some((p) => p.provider_id === input.provider_id)) {
      return {
        ok: false,
        error: {
          code: "provider_unavailable",
          message: `Unknown provider. Available providers: ${project.providers.map((p) => `${p.provider_id} (${p.name})`).join(", ")}.`,
          recovery_kind: "fix_input",
        },
      };
    }
    const run_id = `wc_agent_run_${base32ish(`${principal.id}\0${input.idempotency_key}`)}`;
    const fingerprint = createHash("sha256").update(input.prompt).digest("hex");
    const existing = this.runs.get(run_id);
    if (existing) {
      if (existing.fingerprint !== fingerprint) {
        return {
          ok: false,
          error: { code: "idempotency_conflict", message: "different intent", recovery_kind: "fix_input" },
        };
      }
      return { ok: true, value: this.#startOut(existing, true) };
    }
    const run: FakeRun = {
      run_id,
      principal_id: principal.id,
      project_id: input.project_id,
      state: "running",
      events: [
        { seq: 1, at: new Date().toISOString(), kind: "agent_message", text: this.firstMessage, truncated: false },
      ],
      fingerprint,
    };
    this.runs.set(run_id, run);
    return { ok: true, value: this.#startOut(run, false) };
  }

  #startOut(run: FakeRun, replayed: boolean): StartOutput {
    return {
      run_id: run.run_id,
      state: run.state,
      execution_state: "started",
      replayed,
      observation_token: `tok:${run.run_id}:0`,
    };
  }

  #owned(principal: Principal, runId: string): FakeRun | undefined {
    const run = this.runs.get(runId);
    return run && run.principal_id === principal.id ? run : undefined;
  }

  async observe(principal: Principal, input: ObserveInput, signal?: AbortSignal): Promise<ApiResult<ObserveOutput>> {
    const denied = missingScopes(principal, [TOOL_SCOPE], "Observing a coding agent");
    if (denied) return { ok: false, error: denied };
    const run = this.#owned(principal, input.run_id);
    if (!run) return { ok: false, error: { code: "not_found", message: "no such run", recovery_kind: "none" } };
    let after = 0;
    if (input.after_observation_token !== undefined) {
      const m = /^tok:(wc_agent_run_[a-z2-7]{26}):(\d+)$/.exec(input.after_observation_token);
      if (!m || m[1] !== run.run_id) {
        return {
          ok: false,
          error: { code: "invalid_observation_token", message: "bad token", recovery_kind: "reobserve" },
        };
      }
      after = Number(m[2]);
    }
    const waitMs = Math.min(input.wait_secs ?? 0, 30) * 1000;
    if (waitMs > 0 && !run.events.some((e) => e.seq > after)) {
      await new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(timer);
          this.#wakers.delete(done);
          signal?.removeEventListener("abort", done);
          resolve();
        };
        const timer = setTimeout(done, waitMs);
        this.#wakers.add(done);
        signal?.addEventListener("abort", done, { once: true });
      });
    }
    const events = run.events.filter((e) => e.seq > after);
    const last = events.at(-1)?.seq ?? after;
    return {
      ok: true,
      value: {
        run_id: run.run_id,
        state: run.state,
        execution_state: "started",
        recovery_kind: "wait",
        events,
        observation_token: `tok:${run.run_id}:${last}`,
        history_lost: false,
        has_more: false,
        effective_config: [],
      },
    };
  }

  /** No run of this fake has a workspace: answered as the run core answers a shared project's run. */
  async changes(_principal: Principal, input: { run_id: string }): Promise<ApiResult<RunChanges>> {
    return {
      ok: false,
      error: { code: "invalid_input", message: `Run ${input.run_id} has no recorded change.`, recovery_kind: "none" },
    };
  }

  /** No run of this fake has a workspace: answered as the Runner answers a shared project's run. */
  async apply(_principal: Principal, input: { run_id: string }): Promise<ApiResult<RunApply>> {
    return {
      ok: false,
      error: {
        code: "apply_refused",
        message: `Run ${input.run_id} has no change to apply.`,
        recovery_kind: "none",
        apply_refusal: "shared_project",
      },
    };
  }

  async cancel(principal: Principal, input: { run_id: string }): Promise<ApiResult<CancelOutput>> {
    const denied = missingScopes(principal, [TOOL_SCOPE], "Cancelling a coding agent");
    if (denied) return { ok: false, error: denied };
    const run = this.#owned(principal, input.run_id);
    if (!run) return { ok: false, error: { code: "not_found", message: "no such run", recovery_kind: "none" } };
    const already = run.state === "cancelled";
    run.state = "cancelled";
    this.wake();
    return {
      ok: true,
      value: { run_id: run.run_id, state: run.state, cancel_requested: !already, already_terminal: already },
    };
  }

  lastToolStep(): null {
    return null;
  }

  async listProjects(principal: Principal): Promise<ProjectView[]> {
    return this.projects.filter((p) => principal.projects.has(p.project_id));
  }

  /** Number of observes currently parked. */
  get waiting(): number {
    return this.#wakers.size;
  }

  wake(): void {
    for (const w of [...this.#wakers]) w();
  }
}

function base32ish(text: string): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz234567";
  const digest = createHash("sha256").update(text).digest();
  let out = "";
  for (let i = 0; i < 26; i++) out += alphabet[(digest[i] ?? 0) & 31];
  return out;
}

export function principal(id: string, scopes: string[], projects: string[] = ["demo"]): Principal {
  return { id, scopes: new Set(scopes) as Principal["scopes"], projects: new Set(projects) };
}
