import type { AgentContext, JsonRpcId, PromptResponse, SessionUpdate } from "@agentclientprotocol/sdk";
import { z } from "zod";
import type { Ledger } from "./ledger.js";
import type { Lifecycle } from "./lifecycle.js";
import type { StdoutSink } from "./output.js";
import type { Session } from "./session.js";

/** Everything a scenario may touch while it plays one prompt turn. */
export interface Turn {
  readonly session: Session;
  readonly client: AgentContext;
  /** JSON-RPC id of the `session/prompt` request being answered. */
  readonly requestId: JsonRpcId;
  /** Aborts on `session/cancel` (or `$/cancel_request`) for this turn. */
  readonly cancelled: AbortSignal;
  readonly ledger: Ledger;
  readonly out: StdoutSink;
  readonly life: Lifecycle;
}

export function update(turn: Turn, sessionUpdate: SessionUpdate): Promise<void> {
  return turn.client.notify("session/update", { sessionId: turn.session.id, update: sessionUpdate });
}

export function say(turn: Turn, text: string): Promise<void> {
  return update(turn, { sessionUpdate: "agent_message_chunk", content: { type: "text", text } });
}

export const END_TURN: PromptResponse = { stopReason: "end_turn" };
export const CANCELLED: PromptResponse = { stopReason: "cancelled" };

/** A named, parameterised behaviour for one prompt turn. */
export interface Scenario {
  /** One usage example, e.g. `burst count=1000 chunk=32 kind=message`. */
  readonly usage: string;
  run(turn: Turn, params: Readonly<Record<string, string>>): Promise<PromptResponse>;
}

/** Defines a scenario whose `key=value` parameters are validated by `schema` (bad ones end the turn with a message). */
export function scenario<S extends z.ZodType<unknown, Record<string, string | undefined>>>(
  usage: string,
  schema: S,
  play: (turn: Turn, params: z.output<S>) => Promise<PromptResponse>,
): Scenario {
  return {
    usage,
    async run(turn, params) {
      const parsed = schema.safeParse(params);
      if (!parsed.success) {
        await say(turn, `Invalid parameters for scenario ${usage.split(" ")[0]}: ${z.prettifyError(parsed.error)}`);
        return END_TURN;
      }
      return play(turn, parsed.data);
    },
  };
}

/** An optional decimal integer parameter within [min, max]. */
export function intParam(fallback: number, min: number, max: number) {
  return z
    .string()
    .regex(/^\d+$/, "expected a non-negative integer")
    .optional()
    .transform((raw) => (raw === undefined ? fallback : Number(raw)))
    .pipe(z.number().int().min(min).max(max));
}

export const noParams = z.object({}).strict();
