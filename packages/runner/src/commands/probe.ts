/**
 * Operator probe of one configured agent (`webcodex-runner check --probe`):
 * spawn it exactly as a run would (cleared env, own group, cwd = a project
 * root), run `initialize` + `session/new`, apply the agent's forced config
 * exactly as a run's config sequencing would (design §4.3 step 3, no caller
 * keys), report what it advertises and how the forced config fared, and
 * clean the process tree up. Never sends a prompt.
 */
import type { InitializeResponse, NewSessionResponse } from "@agentclientprotocol/sdk";
import { sequenceConfig } from "../acp/config-sequencing.js";
import { ACP_PROTOCOL_VERSION, AcpClientConnection, type RequestOutcome } from "../acp/session.js";
import type { AgentConfig, ProjectConfig } from "../config/config.js";
import { resolveChildEnv, SpawnError, spawnAgent } from "../process/spawn.js";
import { ACP_AUTH_REQUIRED, authRequiredReason, type ForcedOutcome } from "./probe-verdict.js";

export type ProbeResult =
  | { ok: true; initialize: InitializeResponse; session: NewSessionResponse; forced: ForcedOutcome }
  | {
      ok: false;
      stage: "spawn" | "initialize" | "session_new";
      reason: string;
      /** What the agent advertised, when it got past `initialize`. */
      initialize?: InitializeResponse;
      /** session/new was refused with ACP auth_required (-32000). */
      authRequired?: boolean;
    };

function describe(outcome: Exclude<RequestOutcome<unknown>, { kind: "ok" }> | { kind: "timeout" }): string {
  switch (outcome.kind) {
    case "rpc_error":
      return `the agent answered with JSON-RPC error ${outcome.code}`;
    case "fault":
      return `transport fault: ${outcome.fault}`;
    case "timeout":
      return "no answer before setup_timeout_secs";
  }
}

export async function probeAgent(options: {
  agent: AgentConfig;
  project: ProjectConfig;
  timeoutSecs: number;
  sourceEnv?: NodeJS.ProcessEnv;
  graceMs?: number;
}): Promise<ProbeResult> {
  const env = resolveChildEnv(options.agent, options.sourceEnv ?? process.env);
  if (!env.ok) {
    return { ok: false, stage: "spawn", reason: `source variable ${env.missingSource} is not set on the Runner` };
  }
  let child: Awaited<ReturnType<typeof spawnAgent>>;
  try {
    // As the first user of a run_as pool, unleased: a probe sends no prompt, and it does not sweep (a
    // running daemon owns the pool).
    child = await spawnAgent({
      agent: options.agent,
      runAs: options.agent.runAs?.users[0] ?? null,
      cwd: options.project.root,
      env: env.env,
    });
  } catch (error) {
    return {
      ok: false,
      stage: "spawn",
      reason: `spawn failed (${error instanceof SpawnError ? error.code : "unknown"})`,
    };
  }
  const conn = new AcpClientConnection(child, {
    onSessionUpdate: () => {},
    onPermissionRequest: async () => ({ outcome: { outcome: "cancelled" } }),
    onUnsupportedRequest: () => {},
  });
  const deadline = Date.now() + options.timeoutSecs * 1000;
  const timed = async <T>(p: Promise<RequestOutcome<T>>) => {
    let timer: NodeJS.Timeout | undefined;
    try {
      return await Promise.race([
        p,
        new Promise<{ kind: "timeout" }>((resolve) => {
          timer = setTimeout(() => resolve({ kind: "timeout" }), Math.max(0, deadline - Date.now()));
        }),
      ]);
    } finally {
      clearTimeout(timer);
    }
  };
  try {
    const init = await timed(conn.initialize());
    if (init.kind !== "ok") return { ok: false, stage: "initialize", reason: describe(init) };
    if (init.value.protocolVersion !== ACP_PROTOCOL_VERSION) {
      return {
        ok: false,
        stage: "initialize",
        reason: `unsupported ACP protocol version ${String(init.value.protocolVersion)} (this Runner speaks ${ACP_PROTOCOL_VERSION})`,
      };
    }
    const session = await timed(conn.newSession(options.project.root));
    if (session.kind === "rpc_error" && session.code === ACP_AUTH_REQUIRED) {
      const reason = authRequiredReason(options.agent, init.value);
      return { ok: false, stage: "session_new", reason, initialize: init.value, authRequired: true };
    }
    if (session.kind !== "ok") {
      return { ok: false, stage: "session_new", reason: describe(session), initialize: init.value };
    }
    const sessionId = session.value.sessionId;
    let timedOut = false;
    const sequenced = await sequenceConfig({
      forced: options.agent.forcedConfig,
      caller: {},
      allowed: options.agent.allowedConfigOptions,
      initial: session.value.configOptions,
      set: async (id, value) => {
        const outcome = await timed(conn.setConfigOption(sessionId, id, value));
        if (outcome.kind !== "timeout") return outcome;
        timedOut = true;
        return { kind: "fault", fault: "stdout_closed" };
      },
    });
    const forced: ForcedOutcome = sequenced.ok
      ? { ok: true, effective: sequenced.effective }
      : {
          ok: false,
          detail: timedOut
            ? "no answer to session/set_config_option before setup_timeout_secs"
            : sequenced.failureKind === "fault"
              ? `transport fault: ${sequenced.outcome.fault}`
              : sequenced.detail,
        };
    return { ok: true, initialize: init.value, session: session.value, forced };
  } finally {
    conn.close();
    await child.terminateTree(options.graceMs ?? 2000);
  }
}
