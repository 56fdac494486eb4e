import { join } from "node:path";
import { type PermissionOption, RequestError, type RequestPermissionResponse } from "@agentclientprotocol/sdk";
import { aborted } from "../lifecycle.js";
import { CANCELLED, END_TURN, noParams, type Scenario, say, scenario, type Turn, update } from "../turn.js";

export const PERMISSION_OPTIONS: PermissionOption[] = [
  { optionId: "allow_once", name: "Allow once", kind: "allow_once" },
  { optionId: "allow_always", name: "Allow always", kind: "allow_always" },
  { optionId: "reject_once", name: "Reject", kind: "reject_once" },
];

function errorCode(error: unknown): number | null {
  return error instanceof RequestError ? error.code : null;
}

function recordOutcome(turn: Turn, response: RequestPermissionResponse): void {
  const { outcome } = response;
  turn.ledger.append(
    outcome.outcome === "selected"
      ? { event: "permission_outcome", outcome: "selected", option_id: outcome.optionId }
      : { event: "permission_outcome", outcome: "cancelled" },
  );
}

export const permission: Scenario = scenario("permission", noParams, async (turn) => {
  const path = join(turn.session.cwd, "src", "math.js");
  const toolCall = { toolCallId: "call-perm-1", title: "Edit src/math.js", kind: "edit", status: "pending" } as const;
  await update(turn, { sessionUpdate: "tool_call", ...toolCall, locations: [{ path }] });

  const request: Promise<RequestPermissionResponse> = turn.client.request("session/request_permission", {
    sessionId: turn.session.id,
    toolCall,
    options: PERMISSION_OPTIONS,
  });
  type Waited = { kind: "answered"; response: RequestPermissionResponse } | { kind: "failed"; error: unknown };
  const answered: Promise<Waited> = request.then(
    (response) => ({ kind: "answered", response }),
    (error: unknown) => ({ kind: "failed", error }),
  );
  const waited = await Promise.race([answered, aborted(turn.cancelled).then(() => "cancel" as const)]);

  if (waited === "cancel") {
    // ACP wants the client to answer `cancelled` before `session/cancel`; if it
    // did not, end the turn anyway and still record the answer when it comes.
    void answered.then((late) => {
      if (late.kind === "answered") recordOutcome(turn, late.response);
    });
    return CANCELLED;
  }
  if (waited.kind === "failed") {
    const code = errorCode(waited.error);
    turn.ledger.append({ event: "client_error", method: "session/request_permission", code });
    await say(turn, `session/request_permission failed (JSON-RPC error ${code ?? "none"}).`);
    return END_TURN;
  }
  recordOutcome(turn, waited.response);
  const { outcome } = waited.response;
  if (outcome.outcome === "cancelled") return CANCELLED;
  await say(turn, `Permission outcome: selected option ${outcome.optionId}.`);
  return END_TURN;
});

async function callClient(turn: Turn, method: string, call: () => Promise<unknown>): Promise<void> {
  let code: number | null = null;
  let report: string;
  try {
    await call();
    report = `${method} succeeded.`;
  } catch (error) {
    code = errorCode(error);
    report =
      code === null ? `${method} failed without a JSON-RPC error.` : `${method} failed with JSON-RPC error ${code}.`;
  }
  turn.ledger.append({ event: "client_error", method, code });
  await say(turn, report);
}

export const fsRequest: Scenario = scenario("fs_request", noParams, async (turn) => {
  await callClient(turn, "fs/read_text_file", () =>
    turn.client.request("fs/read_text_file", { sessionId: turn.session.id, path: join(turn.session.cwd, "README.md") }),
  );
  return END_TURN;
});

export const terminalRequest: Scenario = scenario("terminal_request", noParams, async (turn) => {
  await callClient(turn, "terminal/create", () =>
    turn.client.request("terminal/create", {
      sessionId: turn.session.id,
      command: "echo",
      args: ["hello"],
      cwd: turn.session.cwd,
    }),
  );
  return END_TURN;
});
