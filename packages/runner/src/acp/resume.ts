/**
 * Continuation (design §17): instead of `session/new`, a continuing run takes up its parent run's ACP
 * session — `session/resume` when the agent advertises it, else `session/load` (whose replayed history
 * acp/session.ts drops: it is the parent's, not this run's events). The session setup calls this in place of
 * `newSession`; everything after (config, barrier, prompt) is a run's as ever.
 */
import type { AgentCapabilities, SessionConfigOption } from "@agentclientprotocol/sdk";
import type { Run } from "../runs/record.js";
import { notStarted, type Terminal } from "../runs/terminal.js";
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

/** How the turn races a setup request (its deadline, cancellation) and names a failed one. */
export interface SetupSeams {
  step<T>(request: Promise<RequestOutcome<T>>): Promise<RequestOutcome<T> | { kind: "aborted" }>;
  failure(outcome: Failed): Terminal;
}

/**
 * Take up `parentSessionId` in the project root: the session id (kept on the run, as `session/new`'s is) and the
 * live config options, or the Terminal that ends the run not started.
 */
export async function continueSession(
  run: Run,
  conn: AcpClientConnection,
  parentSessionId: string,
  seams: SetupSeams,
): Promise<
  | { end: Terminal; value?: undefined }
  | { end?: undefined; value: { sessionId: string; configOptions: SessionConfigOption[] | null | undefined } }
> {
  run.stage = "session_new";
  const method = continueMethodOf(conn.agentCapabilities);
  if (method === null) return { end: notStarted("provider_rejected", "session_new", CONTINUATION_UNSUPPORTED_DETAIL) };
  const cwd = run.project.root;
  const answer = await seams.step(
    method === "resume" ? conn.resumeSession(parentSessionId, cwd) : conn.loadSession(parentSessionId, cwd),
  );
  if (answer.kind !== "ok") return { end: seams.failure(answer) };
  run.sessionId = parentSessionId;
  return { value: { sessionId: parentSessionId, configOptions: answer.value?.configOptions } };
}
