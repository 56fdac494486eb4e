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
 * so the count of lines is exactly the count of prompts received. `cancel`
 * lines (`session/cancel`), `set_config_option` lines (each
 * `session/set_config_option` request, so tests can check the order of calls)
 * and `permission_outcome` lines (a response carrying
 * a permission outcome) are written here too, so the ledger has them in the
 * order they arrived.
 */
export function tapPrompts(stream: Stream, ledger: Ledger): Stream {
  const tap = new TransformStream<AnyMessage, AnyMessage>({
    transform(message, controller) {
      if ("method" in message && "id" in message && message.method === "session/prompt") {
        const sessionId = field(message.params, "sessionId");
        ledger.prompt(typeof sessionId === "string" ? sessionId : null, promptTextOf(field(message.params, "prompt")));
      } else if ("method" in message && "id" in message && message.method === "session/set_config_option") {
        const sessionId = field(message.params, "sessionId");
        const configId = field(message.params, "configId");
        const value = field(message.params, "value");
        ledger.append({
          event: "set_config_option",
          session_id: typeof sessionId === "string" ? sessionId : null,
          config_id: typeof configId === "string" ? configId : null,
          value: typeof value === "string" || typeof value === "boolean" ? value : null,
          pid: process.pid,
        });
      } else if ("method" in message && !("id" in message) && message.method === "session/cancel") {
        const sessionId = field(message.params, "sessionId");
        ledger.append({
          event: "cancel",
          session_id: typeof sessionId === "string" ? sessionId : null,
          pid: process.pid,
        });
      } else if (!("method" in message) && "result" in message) {
        const outcome = field(field(message.result, "outcome"), "outcome");
        const optionId = field(field(message.result, "outcome"), "optionId");
        if (outcome === "cancelled") ledger.append({ event: "permission_outcome", outcome: "cancelled" });
        else if (outcome === "selected" && typeof optionId === "string") {
          ledger.append({ event: "permission_outcome", outcome: "selected", option_id: optionId });
        }
      }
      controller.enqueue(message);
    },
  });
  return { readable: stream.readable.pipeThrough(tap), writable: stream.writable };
}
