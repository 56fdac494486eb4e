/**
 * The client side of one ACP v1 connection to an agent child (design §4.3),
 * over the SDK's ndJsonStream with a bounded line size.
 *
 * What this file adds to the SDK:
 * - transport faults become one typed result (`fault`), never an exception:
 *   malformed or non-JSON-RPC lines (the SDK answers them with an `id: null`
 *   protocol error and carries on — we see that answer on its way out and
 *   close), oversized lines, stdout closed, process exit, I/O errors;
 * - `promptWritten`: resolves once the next `session/prompt` request has been
 *   handed to the child's stdin, which is the moment the prompt may have run
 *   (one per prompt: a kept agent's connection serves several turns);
 * - only implemented client capabilities are advertised, and every
 *   agent→client request other than `session/request_permission` gets
 *   "method not found" at once;
 * - JSON-RPC responses whose id is not one of our outstanding requests are
 *   dropped and counted (`droppedResponses`) before the SDK sees them: the SDK
 *   would console.error agent-chosen text ("Got response to unknown request");
 * - `session/update` notifications (nearly every line an agent writes) are
 *   validated once by the validator generated from the SDK's exported JSON
 *   Schema (acp/session-update-validator.ts) and handed to `onSessionUpdate`
 *   directly, instead of through the SDK's handler chain, which parses each
 *   one twice; one that validator does not accept as is (invalid, or needing
 *   the SDK's salvage or key stripping) takes the SDK's own path, so what
 *   reaches the hook is exactly what the SDK's handler would have delivered.
 *   Updates reach the hook in stream order either way, also relative to the
 *   requests and responses the SDK handles. Costs per update:
 *   docs/benchmarks.md.
 */

import {
  type AgentCapabilities,
  type AnyMessage,
  client,
  type InitializeResponse,
  type LoadSessionResponse,
  MessageTooLargeError,
  type NewSessionResponse,
  ndJsonStream,
  type PromptResponse,
  RequestError,
  type RequestPermissionRequest,
  type RequestPermissionResponse,
  type ResumeSessionResponse,
  type SessionConfigOption,
  type SessionNotification,
} from "@agentclientprotocol/sdk";
import type { AgentChild } from "../process/spawn.js";
import { RUNNER_VERSION } from "../version.js";
import { isAvailable, type SessionUpdateValidators, sessionUpdateValidators } from "./session-update-validator.js";

/** The ACP protocol version this client implements. */
export const ACP_PROTOCOL_VERSION = 1;
/** Default bound of one line the agent writes to stdout. */
export const DEFAULT_MAX_ACP_MESSAGE_BYTES = 8 * 1024 * 1024;
export const CLIENT_INFO = { name: "webcodex-runner", title: "WebCodex Runner", version: RUNNER_VERSION } as const;

export type TransportFault =
  | "malformed_message"
  | "oversized_message"
  | "stdout_closed"
  | "provider_exited"
  | "io_error";

export interface AcpHooks {
  onSessionUpdate(notification: SessionNotification): void;
  /** Must never select an allow option; resolves with the answer to send. */
  onPermissionRequest(params: RequestPermissionRequest, signal: AbortSignal): Promise<RequestPermissionResponse>;
  /** Called for every agent→client request we refuse (fs/*, terminal/*, elicitation, unknown). */
  onUnsupportedRequest(method: string): void;
}

/** Outcome of one request: the agent's answer, its JSON-RPC error, or the transport failing first. */
export type RequestOutcome<T> =
  | { kind: "ok"; value: T }
  | { kind: "rpc_error"; code: number }
  | { kind: "fault"; fault: TransportFault };

class MalformedMessageError extends Error {
  override readonly name = "MalformedMessageError";
}

/** The `id: null` error the SDK sends back when a line is not JSON or not JSON-RPC. */
const PROTOCOL_ERROR_PREFIX = new TextEncoder().encode('{"jsonrpc":"2.0","id":null,"error":');

/** A JSON-RPC `session/update` notification as the SDK's connection classifies one (envelope, no id). */
function isSessionUpdate(message: unknown): message is { method: "session/update"; params: unknown } {
  if (typeof message !== "object" || message === null || Array.isArray(message)) return false;
  const m = message as { jsonrpc?: unknown; method?: unknown };
  return m.jsonrpc === "2.0" && m.method === "session/update" && !("id" in m);
}

function startsWith(chunk: Uint8Array, prefix: Uint8Array): boolean {
  if (chunk.byteLength < prefix.byteLength) return false;
  for (let i = 0; i < prefix.byteLength; i++) if (chunk[i] !== prefix[i]) return false;
  return true;
}

const KNOWN_CLIENT_METHODS = new Set([
  "fs/read_text_file",
  "fs/write_text_file",
  "terminal/create",
  "terminal/output",
  "terminal/release",
  "terminal/wait_for_exit",
  "terminal/kill",
  "elicitation/create",
]);

/** The method name if it is a known ACP method; unknown names are provider text and stay out of logs. */
export function loggableMethod(method: string): string {
  return KNOWN_CLIENT_METHODS.has(method) ? method : "(unknown)";
}

export class AcpClientConnection {
  /** Resolves with the first transport fault (or once the connection is closed locally). Never rejects. */
  readonly fault: Promise<TransportFault>;
  /** The next `session/prompt` write: resolved when it is written, then replaced for the one after. */
  #nextPromptWritten!: { promise: Promise<void>; resolve: () => void };
  readonly #connection: ReturnType<ReturnType<typeof client>["connect"]>;
  readonly #child: AgentChild;
  /** Ids (JSON-encoded) of our requests still awaiting their response. */
  readonly #outstanding = new Set<string>();
  #dropped = 0;
  #malformed = false;
  #stdoutEnded = false;
  #closedLocally = false;
  /** What the agent's `initialize` answer advertised (null until it answered). */
  #capabilities: AgentCapabilities | null = null;
  /** While `session/load` of this session is outstanding: its replayed history, dropped before the hooks. */
  #replaying: string | null = null;

  /** Whose turn the agent's requests and updates go to (`rebind`: a kept agent's next turn, runs/kept-agents.ts). */
  #hooks: AcpHooks;

  constructor(child: AgentChild, hooks: AcpHooks, options: { maxMessageBytes?: number } = {}) {
    this.#child = child;
    this.#hooks = hooks;

    // Byte-level tap on the child's stdin: spot the SDK answering a bad line.
    const stdinWriter = child.stdin.getWriter();
    const output = new WritableStream<Uint8Array>({
      write: async (chunk) => {
        if (startsWith(chunk, PROTOCOL_ERROR_PREFIX)) {
          this.#malformed = true;
          this.#connection.close(new MalformedMessageError("agent wrote a malformed message"));
          return;
        }
        await stdinWriter.write(chunk);
      },
      close: () => stdinWriter.close(),
      abort: (reason) => stdinWriter.abort(reason),
    });
    // Notice EOF of stdout (as opposed to an error) for the fault classification.
    const input = child.stdout.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        flush: () => {
          this.#stdoutEnded = true;
        },
      }),
    );
    const raw = ndJsonStream(output, input, {
      maxMessageBytes: options.maxMessageBytes ?? DEFAULT_MAX_ACP_MESSAGE_BYTES,
    });

    this.#armPromptWritten();
    const markWritten = () => {
      const written = this.#nextPromptWritten;
      this.#armPromptWritten();
      written.resolve();
    };
    const rawWriter = raw.writable.getWriter();
    const writable = new WritableStream<AnyMessage>({
      write: async (message) => {
        if ("method" in message && "id" in message) this.#outstanding.add(JSON.stringify(message.id));
        await rawWriter.write(message);
        if ("method" in message && message.method === "session/prompt" && "id" in message) markWritten();
      },
      close: () => rawWriter.close(),
      abort: (reason) => rawWriter.abort(reason),
    });

    const app = client({ name: "webcodex-runner" })
      .onNotification("session/update", (ctx) => {
        if (ctx.params.sessionId === this.#replaying) return;
        this.#hooks.onSessionUpdate(ctx.params);
      })
      .onRequest("session/request_permission", (ctx) => this.#hooks.onPermissionRequest(ctx.params, ctx.signal))
      .onRequest("*", (ctx) => {
        this.#hooks.onUnsupportedRequest(ctx.method);
        throw RequestError.methodNotFound(ctx.method);
      });
    // Responses nobody asked for never reach the SDK (protocol noise, counted). A pull source over
    // the SDK's reader rather than pipeThrough(TransformStream): one read per message instead of a
    // pipe loop plus transform and writer promises (every session/update passes here).
    const rawReader = raw.readable.getReader();
    /** Undefined until the generated validators have loaded (or are known to be unavailable: null). */
    let validators: SessionUpdateValidators | null | undefined;
    /** A message was left to the SDK; the next direct delivery waits until the SDK has handled it. */
    let sdkPending = false;
    const readable = new ReadableStream<AnyMessage>({
      pull: async (controller) => {
        if (validators === undefined) {
          const loaded = await sessionUpdateValidators;
          validators = isAvailable(loaded) ? loaded : null;
        }
        for (;;) {
          const next = await rawReader.read();
          if (next.done) {
            controller.close();
            return;
          }
          const message = next.value;
          if ("id" in message && !("method" in message)) {
            const key = JSON.stringify(message.id ?? null);
            if (!this.#outstanding.delete(key)) {
              this.#dropped++;
              continue;
            }
          }
          if (validators !== null && isSessionUpdate(message)) {
            if (validators.accepts(message.params) && !this.#connection.signal.aborted) {
              if (sdkPending) {
                // The SDK dispatches a message in microtasks; one macrotask later the one left to it has
                // reached its handler (or been rejected), so this update cannot overtake it.
                await new Promise((resolve) => setImmediate(resolve));
                sdkPending = false;
              }
              if (this.#connection.signal.aborted) {
                controller.enqueue(message); // closed meanwhile: the SDK drops it, as it would have
                return;
              }
              try {
                if ((message.params as { sessionId?: unknown }).sessionId !== this.#replaying) {
                  this.#hooks.onSessionUpdate(message.params);
                }
              } catch {
                // As on the SDK's path: a throwing handler loses that update, never the connection.
              }
              continue;
            }
          }
          sdkPending = validators !== null;
          controller.enqueue(message);
          return;
        }
      },
      cancel: (reason) => rawReader.cancel(reason),
    });
    this.#connection = app.connect({ readable, writable });

    this.fault = this.#connection.closed.then(() => this.#classify(this.#connection.signal.reason));
  }

  async #classify(reason: unknown): Promise<TransportFault> {
    if (this.#malformed || reason instanceof MalformedMessageError) return "malformed_message";
    if (reason instanceof MessageTooLargeError) return "oversized_message";
    if (this.#closedLocally) return "io_error";
    // stdout EOF and the exit event race; give the exit a moment to arrive.
    let timer: NodeJS.Timeout | undefined;
    const exited = await Promise.race([
      this.#child.exited.then(() => true),
      new Promise<false>((resolve) => {
        timer = setTimeout(() => resolve(false), 2000);
      }),
    ]);
    clearTimeout(timer);
    if (exited) return "provider_exited";
    return this.#stdoutEnded ? "stdout_closed" : "io_error";
  }

  /** Race a request against the transport. A correlated JSON-RPC error is `rpc_error`, never a fault. */
  async #request<T>(promise: Promise<T>): Promise<RequestOutcome<T>> {
    const answered = promise.then(
      (value): RequestOutcome<T> => ({ kind: "ok", value }),
      (error: unknown): RequestOutcome<T> | null =>
        error instanceof RequestError && !this.#connection.signal.aborted
          ? { kind: "rpc_error", code: error.code }
          : null,
    );
    const first = await Promise.race([answered, this.fault.then((fault) => ({ kind: "fault" as const, fault }))]);
    if (first === null) return { kind: "fault", fault: await this.fault };
    return first;
  }

  initialize(): Promise<RequestOutcome<InitializeResponse>> {
    return this.#request(
      this.#connection.agent
        .request("initialize", {
          protocolVersion: ACP_PROTOCOL_VERSION,
          clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
          clientInfo: { ...CLIENT_INFO },
        })
        .then((answer) => {
          this.#capabilities = answer.agentCapabilities ?? {};
          return answer;
        }),
    );
  }

  /** The capabilities the agent's `initialize` answer advertised; null before it answered. */
  get agentCapabilities(): AgentCapabilities | null {
    return this.#capabilities;
  }

  /** `session/resume` (design §17): the agent takes the session up again without replaying it. */
  resumeSession(sessionId: string, cwd: string): Promise<RequestOutcome<ResumeSessionResponse>> {
    return this.#request(this.#connection.agent.request("session/resume", { sessionId, cwd, mcpServers: [] }));
  }

  /**
   * `session/load` (design §17): the agent streams the session's history back as session/update before it
   * answers; those updates are dropped here (they are the parent run's, not this one's), in stream order, so
   * every update after the answer is the new turn's.
   */
  loadSession(sessionId: string, cwd: string): Promise<RequestOutcome<LoadSessionResponse>> {
    this.#replaying = sessionId;
    return this.#request(this.#connection.agent.request("session/load", { sessionId, cwd, mcpServers: [] })).finally(
      () => {
        this.#replaying = null;
      },
    );
  }

  newSession(cwd: string): Promise<RequestOutcome<NewSessionResponse>> {
    return this.#request(this.#connection.agent.request("session/new", { cwd, mcpServers: [] }));
  }

  /** `session/set_config_option`; resolves with the refreshed option list. */
  setConfigOption(
    sessionId: string,
    configId: string,
    value: string | boolean,
  ): Promise<RequestOutcome<SessionConfigOption[]>> {
    const params =
      typeof value === "boolean"
        ? { sessionId, configId, type: "boolean" as const, value }
        : { sessionId, configId, value };
    return this.#request(
      this.#connection.agent.request("session/set_config_option", params).then((r: unknown) => {
        const options = (r as { configOptions?: unknown } | null)?.configOptions;
        if (!Array.isArray(options)) throw new RequestError(-32603, "missing configOptions");
        return options as SessionConfigOption[];
      }),
    );
  }

  /** Write `session/prompt`. The response promise settles with the correlated answer or the transport fault. */
  prompt(sessionId: string, text: string): Promise<RequestOutcome<PromptResponse>> {
    return this.#request(
      this.#connection.agent.request("session/prompt", { sessionId, prompt: [{ type: "text", text }] }),
    );
  }

  /** `session/cancel` notification (the caller guarantees at most once per run). */
  async cancel(sessionId: string): Promise<void> {
    try {
      await this.#connection.agent.notify("session/cancel", { sessionId });
    } catch {
      // The transport is gone; the fault path reports it.
    }
  }

  /** Responses the agent sent to requests we never made (or answered twice): dropped as protocol noise. */
  get droppedResponses(): number {
    return this.#dropped;
  }

  get closed(): boolean {
    return this.#connection.signal.aborted;
  }

  /** The agent's stdout reached EOF. */
  get stdoutEnded(): boolean {
    return this.#stdoutEnded;
  }

  /**
   * Resolves once the next `session/prompt` request has been written to the child's stdin: read it before sending
   * the prompt (each prompt resolves the promise read before it).
   */
  get promptWritten(): Promise<void> {
    return this.#nextPromptWritten.promise;
  }

  #armPromptWritten(): void {
    let resolve!: () => void;
    const promise = new Promise<void>((r) => {
      resolve = r;
    });
    this.#nextPromptWritten = { promise, resolve };
  }

  /** The connection now serves another turn (a kept agent taken up by a follow-up run; the old turn has ended). */
  rebind(hooks: AcpHooks): void {
    this.#hooks = hooks;
  }

  /** Close the connection locally (pending requests settle as faults). */
  close(): void {
    if (this.#connection.signal.aborted) return;
    this.#closedLocally = true;
    this.#connection.close();
  }
}
