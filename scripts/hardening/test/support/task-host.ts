/**
 * A host driving the managed path (design §10) through a real SDK MCP client,
 * for tests that kill and restart the Server under it: the client is built on
 * first use and dropped after any transport failure (a killed Server), so the
 * next call reconnects to the restarted one on the same port. Tool errors are
 * results (`{ok: false, error}`); only a failed exchange throws.
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

/** How long one tool call may take before the host gives up on it (a start held by a dead Server). */
export const TASK_HOST_CALL_TIMEOUT_MS = 60_000;

export interface ToolError {
  code: string;
  message: string;
  recovery_kind?: string;
}
export type ToolAnswer = { ok: true; value: Record<string, unknown> } | { ok: false; error: ToolError };

export class TaskHost {
  #client: Client | null = null;

  constructor(
    readonly port: () => number,
    readonly token: string,
  ) {}

  async #connected(): Promise<Client> {
    if (this.#client) return this.#client;
    const client = new Client({ name: "webcodex-hardening-task-host", version: "0" });
    await client.connect(
      new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${this.port()}/mcp`), {
        requestInit: { headers: { Authorization: `Bearer ${this.token}` } },
      }),
    );
    this.#client = client;
    return client;
  }

  /** One tools/call; throws (and drops the client) when the exchange itself fails. */
  async call(name: string, args: Record<string, unknown>): Promise<ToolAnswer> {
    try {
      const client = await this.#connected();
      const result = await client.callTool({ name, arguments: args }, undefined, {
        timeout: TASK_HOST_CALL_TIMEOUT_MS,
      });
      const text = (result.content as Array<{ text?: string }>)[0]?.text ?? "{}";
      if (result.isError) return { ok: false, error: (JSON.parse(text) as { error: ToolError }).error };
      return { ok: true, value: result.structuredContent as Record<string, unknown> };
    } catch (err) {
      await this.close();
      throw err;
    }
  }

  /** The value of a call that must succeed. */
  async ok(name: string, args: Record<string, unknown>): Promise<Record<string, unknown>> {
    const r = await this.call(name, args);
    if (!r.ok) throw new Error(`${name} failed: ${JSON.stringify(r.error)}`);
    return r.value;
  }

  async close(): Promise<void> {
    const c = this.#client;
    this.#client = null;
    await c?.close().catch(() => {});
  }
}
