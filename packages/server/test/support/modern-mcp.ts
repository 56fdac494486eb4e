/**
 * A 2026-07-28 MCP request as any client sends it (raw POST, no SDK): the three required headers and the
 * `_meta` envelope, declaring the Tasks extension, so a start answers with a task.
 */
export const MODERN = "2026-07-28";

export function tasksMeta(clientName: string): Record<string, unknown> {
  return {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": { name: clientName, version: "0" },
    "io.modelcontextprotocol/clientCapabilities": { extensions: { "io.modelcontextprotocol/tasks": {} } },
  };
}

export type ModernAnswer = {
  result?: Record<string, unknown>;
  error?: { code: number; message: string; data?: unknown };
};

/** POST `method` to the Server on `port` as a 2026-07-28 client named `clientName`; the raw response. */
export async function postModern(
  port: number,
  token: string,
  method: string,
  params: Record<string, unknown>,
  options: { name?: string; clientName?: string } = {},
): Promise<Response> {
  return await fetch(`http://127.0.0.1:${port}/mcp`, {
    method: "POST",
    headers: {
      Authorization: `Bearer ${token}`,
      Accept: "application/json, text/event-stream",
      "Content-Type": "application/json",
      "MCP-Protocol-Version": MODERN,
      "Mcp-Method": method,
      ...(options.name !== undefined ? { "Mcp-Name": options.name } : {}),
    },
    body: JSON.stringify({
      jsonrpc: "2.0",
      id: 1,
      method,
      params: { ...params, _meta: tasksMeta(options.clientName ?? "webcodex-test") },
    }),
  });
}
