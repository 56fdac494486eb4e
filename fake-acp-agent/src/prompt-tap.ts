import type { AnyMessage, Stream } from "@agentclientprotocol/sdk";
import { type Ledger, promptTextOf } from "./ledger.js";

function field(value: unknown, key: string): unknown {
  return typeof value === "object" && value !== null && key in value
    ? (value as Record<string, unknown>)[key]
    : undefined;
}

/**
 * Writes the ledger's `prompt` line for every inbound `session/prompt` request
 * the moment it is read off stdin, before the SDK validates or dispatches it,
 * so the count of lines is exactly the count of prompts received.
 */
export function tapPrompts(stream: Stream, ledger: Ledger): Stream {
  const tap = new TransformStream<AnyMessage, AnyMessage>({
    transform(message, controller) {
      if ("method" in message && "id" in message && message.method === "session/prompt") {
        const sessionId = field(message.params, "sessionId");
        ledger.prompt(typeof sessionId === "string" ? sessionId : null, promptTextOf(field(message.params, "prompt")));
      }
      controller.enqueue(message);
    },
  });
  return { readable: stream.readable.pipeThrough(tap), writable: stream.writable };
}
