import { join } from "node:path";
import { type PermissionOption, RequestError, type RequestPermissionResponse } from "@agentclientprotocol/sdk";
import { z } from "zod";
import { aborted, sleep } from "../lifecycle.js";
import { CANCELLED, END_TURN, intParam, noParams, type Scenario, say, scenario, type Turn, update } from "../turn.js";

/** How long a cancelled turn waits for the client's answer to a pending permission request. */
const PERMISSION_CANCEL_GRACE_MS = 1_000;

export const PERMISSION_OPTIONS: PermissionOption[] = [
  { optionId: "allow_once", name: "Allow once", kind: "allow_once" },
  { optionId: "allow_always", name: "Allow always", kind: "allow_always" },
  { optionId: "reject_once", name: "Reject", kind: "reject_once" },
];

function errorCode(error: unknown): number | null {
  return error instanceof RequestError ? error.code : null;
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
  // The ledger's permission_outcome line is written as the answer is read (prompt-tap.ts).
  const answered: Promise<Waited> = request.then(
    (response) => ({ kind: "answered", response }),
    (error: unknown) => ({ kind: "failed", error }),
  );
  let waited = await Promise.race([answered, aborted(turn.cancelled).then(() => "cancel" as const)]);
  if (waited === "cancel") {
    // ACP clients answer a pending permission with `cancelled` around
    // `session/cancel`; give that answer a moment so the ledger has it first.
    const late = await Promise.race([answered, sleep(PERMISSION_CANCEL_GRACE_MS).then(() => "timeout" as const)]);
    if (late === "timeout") return CANCELLED; // a later answer is still recorded
    waited = late;
  }

  if (waited.kind === "failed") {
    const code = errorCode(waited.error);
    turn.ledger.append({ event: "client_error", method: "session/request_permission", code });
    if (turn.cancelled.aborted) return CANCELLED;
    await say(turn, `session/request_permission failed (JSON-RPC error ${code ?? "none"}).`);
    return END_TURN;
  }
  const { outcome } = waited.response;
  if (outcome.outcome === "cancelled" || turn.cancelled.aborted) return CANCELLED;
  await say(turn, `Permission outcome: selected option ${outcome.optionId}.`);
  return END_TURN;
});

/**
 * `count` concurrent `session/request_permission` calls (tool calls
 * `call-flood-<i>`), each outcome recorded in the ledger as it arrives. Once
 * all are answered: `cancelled` if any answer was `cancelled`, else `end_turn`;
 * `session/cancel` ends the turn `cancelled` at once (later answers are still recorded).
 */
export const permissionFlood: Scenario = scenario(
  "permission_flood count=64",
  z.object({ count: intParam(64, 1, 10_000) }).strict(),
  async (turn, { count }) => {
    const answers = Array.from({ length: count }, (_, i) =>
      turn.client
        .request("session/request_permission", {
          sessionId: turn.session.id,
          toolCall: { toolCallId: `call-flood-${i}`, title: `Flood ${i}`, kind: "edit", status: "pending" },
          options: PERMISSION_OPTIONS,
        })
        .then(
          (response) => response.outcome.outcome, // ledger line written as it is read (prompt-tap.ts)
          (error: unknown) => {
            turn.ledger.append({ event: "client_error", method: "session/request_permission", code: errorCode(error) });
            return "failed" as const;
          },
        ),
    );
    const all = await Promise.race([Promise.all(answers), aborted(turn.cancelled).then(() => "cancel" as const)]);
    if (all === "cancel" || all.includes("cancelled")) return CANCELLED;
    return END_TURN;
  },
);

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
