import {
  type AgentApp,
  agent,
  type InitializeResponse,
  type LoadSessionResponse,
  type NewSessionResponse,
  PROTOCOL_VERSION,
  RequestError,
} from "@agentclientprotocol/sdk";
import type { AgentOptions } from "./args.js";
import { SessionConfig } from "./config-options.js";
import { type Ledger, promptTextOf } from "./ledger.js";
import { type Lifecycle, never, sleep } from "./lifecycle.js";
import type { StdoutSink } from "./output.js";
import { parseScenarioLine } from "./prompt-line.js";
import { play } from "./scenarios.js";
import { Session } from "./session.js";
import { SessionStore } from "./session-store.js";

export const AGENT_INFO = { name: "fake-acp-agent", title: "Fake ACP agent", version: "0.1.0" } as const;

/** With `--auth-required`: a terminal login (hinted in `_meta`, as Copilot and pi-acp do) and an `authenticate` method. */
const AUTH_METHODS = [
  {
    id: "fake-terminal-login",
    name: "Log in in a terminal",
    _meta: { "terminal-auth": { command: "fake-acp-agent", args: ["login"], label: "Fake login" } },
  },
  { id: "fake-api-key", name: "API key" },
];

export interface AgentDeps {
  readonly options: AgentOptions;
  readonly ledger: Ledger;
  readonly out: StdoutSink;
  readonly life: Lifecycle;
}

/**
 * Builds the ACP agent app: initialize, session/new, session/load and session/resume (as `--continuation`
 * allows), session/set_config_option, session/prompt, session/cancel.
 */
export function buildAgent({ options, ledger, out, life }: AgentDeps): AgentApp {
  const sessions = new Map<string, Session>();
  let sessionCount = 0;
  const store = options.sessionDir === undefined ? null : new SessionStore(options.sessionDir);
  const persist = (session: Session): void => store?.write(session.id, { cwd: session.cwd, prompts: session.prompts });
  const canLoad = options.continuation === "load" || options.continuation === "both";
  const canResume = options.continuation === "resume" || options.continuation === "both";

  /** The `modes` part of a session/new|load|resume answer. */
  const modes = () =>
    options.sessionModes.length === 0
      ? {}
      : {
          modes: {
            availableModes: options.sessionModes.map((id) => ({ id, name: id })),
            currentModeId: options.sessionModes[0] as string,
          },
        };
  const sessionAnswer = (session: Session) =>
    session.config.isEmpty ? { ...modes() } : { configOptions: session.config.toOptions(), ...modes() };

  /** A stored session brought back into this process (session/load, session/resume); null: none by that id. */
  const reopen = (method: "session_load" | "session_resume", sessionId: string, cwd: string): Session | null => {
    const stored = store?.read(sessionId) ?? null;
    ledger.append({ event: method, session_id: sessionId, found: stored !== null, pid: process.pid });
    if (stored === null) return null;
    const session = new Session(
      sessionId,
      cwd,
      new SessionConfig(options.configOptions, options.modeValues),
      [...stored.prompts],
      persist,
    );
    sessions.set(sessionId, session);
    return session;
  };

  const sessionOf = (sessionId: string): Session => {
    const session = sessions.get(sessionId);
    if (!session) throw RequestError.sessionNotFound(sessionId);
    return session;
  };

  return agent({ name: AGENT_INFO.name })
    .onRequest("initialize", async (): Promise<InitializeResponse> => {
      if (options.ledgerInitialize) ledger.append({ event: "initialize", pid: process.pid });
      if (options.exitDuringInitialize) process.exit(1);
      if (options.hangOn === "initialize") {
        life.holdOpen("hang-on initialize");
        return never();
      }
      return {
        protocolVersion: options.protocolVersion ?? PROTOCOL_VERSION,
        agentCapabilities: {
          loadSession: canLoad,
          ...(canResume ? { sessionCapabilities: { resume: {} } } : {}),
          promptCapabilities: { image: false, audio: false, embeddedContext: false },
          mcpCapabilities: { http: false, sse: false },
        },
        authMethods: options.authRequired ? AUTH_METHODS : [],
        agentInfo: options.agentName === undefined ? AGENT_INFO : { ...AGENT_INFO, name: options.agentName },
      };
    })
    .onRequest("session/new", async ({ params }): Promise<NewSessionResponse> => {
      if (options.hangOn === "session_new") {
        life.holdOpen("hang-on session_new");
        return never();
      }
      if (options.sessionNewDelayMs > 0) await sleep(options.sessionNewDelayMs);
      if (options.failSessionNew) throw new RequestError(-32603, "fake session/new failure");
      if (options.authRequired) throw RequestError.authRequired({ authMethods: AUTH_METHODS });
      sessionCount += 1;
      const session = new Session(
        store === null ? `fake-session-${sessionCount}` : SessionStore.newId(),
        params.cwd,
        new SessionConfig(options.configOptions, options.modeValues),
        [],
        persist,
      );
      sessions.set(session.id, session);
      if (store !== null) persist(session);
      return { sessionId: session.id, ...sessionAnswer(session) };
    })
    .onRequest("session/load", async ({ params, client }): Promise<LoadSessionResponse> => {
      if (!canLoad) throw RequestError.methodNotFound("session/load");
      const session = reopen("session_load", params.sessionId, params.cwd);
      if (session === null) throw RequestError.sessionNotFound(params.sessionId);
      // ACP: the whole conversation is streamed back as session/update before the answer.
      // Here: each stored prompt as a user_message_chunk, then a marker agent_message_chunk `replayed: turn N`.
      for (const [i, text] of session.prompts.entries()) {
        await client.notify("session/update", {
          sessionId: session.id,
          update: { sessionUpdate: "user_message_chunk", content: { type: "text", text } },
        });
        await client.notify("session/update", {
          sessionId: session.id,
          update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: `replayed: turn ${i + 1}` } },
        });
      }
      return sessionAnswer(session);
    })
    .onRequest("session/resume", async ({ params }) => {
      if (!canResume) throw RequestError.methodNotFound("session/resume");
      const session = reopen("session_resume", params.sessionId, params.cwd);
      if (session === null) throw RequestError.sessionNotFound(params.sessionId);
      return sessionAnswer(session);
    })
    .onRequest("session/set_config_option", async ({ params }) => {
      return { configOptions: sessionOf(params.sessionId).config.set(params) };
    })
    .onRequest("session/prompt", async ({ params, client, requestId, signal }) => {
      // The ledger's `prompt` line was already written as the request came in (prompt-tap.ts).
      const text = promptTextOf(params.prompt);
      const session = sessionOf(params.sessionId);
      session.sawPrompt(text);
      const turn = session.beginTurn();
      try {
        return await play(
          {
            session,
            client,
            requestId,
            cancelled: AbortSignal.any([turn.signal, signal]),
            ledger,
            out,
            life,
          },
          parseScenarioLine(text),
        );
      } finally {
        turn.end();
      }
    })
    .onNotification("session/cancel", ({ params }) => {
      // Its ledger `cancel` line was already written as it came in (prompt-tap.ts).
      sessions.get(params.sessionId)?.cancel();
    });
}
