/**
 * Continuation (design §17): instead of `session/new`, a continuing run takes up its parent run's ACP
 * session — `session/resume` when the agent advertises it, else `session/load` (whose replayed history
 * acp/session.ts drops: it is the parent's, not this run's events). The session setup calls this in place of
 * `newSession`; everything after (config, barrier, prompt) is a run's as ever. It knows nothing of the run
 * record: the turn hands in how a setup request is raced and how a failure ends the run (`SetupSeams`).
 */
import type { AgentCapabilities, SessionConfigOption } from "@agentclientprotocol/sdk";
import type { AcpClientConnection, RequestOutcome } from "./session.js";

export type ContinueMethod = "resume" | "load";

/** `resume` when advertised, else `load`; null: the agent can do neither. */
export function continueMethodOf(capabilities: AgentCapabilities | null): ContinueMethod | null {
  if (capabilities?.sessionCapabilities?.resume != null) return "resume";
  if (capabilities?.loadSession === true) return "load";
  return null;
}

export const CONTINUATION_UNSUPPORTED_DETAIL =
  "The agent advertises neither session/resume nor session/load, so this run cannot continue its parent's session.";

type Failed = Exclude<RequestOutcome<unknown>, { kind: "ok" }> | { kind: "aborted" };

/** How the turn races a setup request (its deadline, cancellation) and ends the run when setup fails. */
export interface SetupSeams<End> {
  step<T>(request: Promise<RequestOutcome<T>>): Promise<RequestOutcome<T> | { kind: "aborted" }>;
  /** A request that failed (transport fault, JSON-RPC error, aborted). */
  failure(outcome: Failed): End;
  /** The agent's `initialize` advertised neither method (CONTINUATION_UNSUPPORTED_DETAIL). */
  unsupported(): End;
}

/**
 * Take up `parentSessionId` in `cwd`: the session id (the parent's, which the run keeps as its own) and the live
 * config options, or how the run ends not started.
 */
export async function continueSession<End>(
  conn: AcpClientConnection,
  parentSessionId: string,
  cwd: string,
  seams: SetupSeams<End>,
): Promise<
  | { end: End; value?: undefined }
  | { end?: undefined; value: { sessionId: string; configOptions: SessionConfigOption[] | null | undefined } }
> {
  const method = continueMethodOf(conn.agentCapabilities);
  if (method === null) return { end: seams.unsupported() };
  const answer = await seams.step(
    method === "resume" ? conn.resumeSession(parentSessionId, cwd) : conn.loadSession(parentSessionId, cwd),
  );
  if (answer.kind !== "ok") return { end: seams.failure(answer) };
  return { value: { sessionId: parentSessionId, configOptions: answer.value?.configOptions } };
}
