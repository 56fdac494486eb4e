/** A real MCP client (SDK Client + StreamableHTTPClientTransport) with the three tools as methods. */
import { randomUUID } from "node:crypto";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { AjvJsonSchemaValidator } from "@modelcontextprotocol/sdk/validation/ajv";
import { unwrap } from "./tool-result.mjs";

// One validator for every client of this process (hundreds in the fan-out): the
// bench's load generator should not be the bottleneck it measures.
const SHARED_VALIDATOR = new AjvJsonSchemaValidator();

const TERMINAL = new Set(["completed", "failed", "cancelled", "lost"]);

/** Connects to `${url}` (the /mcp endpoint) with a bearer token. */
export async function connectMcp({ url, token, projectId, name = "webcodex-bench" }) {
  const client = new Client({ name, version: "0.0.0" }, { jsonSchemaValidator: SHARED_VALIDATOR });
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  const call = async (name, args, timeoutMs = 60_000) =>
    unwrap(await client.callTool({ name, arguments: args }, undefined, { timeout: timeoutMs }));

  const api = {
    client,
    start: ({
      provider_id,
      prompt,
      project_id = projectId,
      timeout_secs,
      idempotency_key = randomUUID(),
      continue_run_id,
    }) =>
      call("start_coding_agent", {
        project_id,
        provider_id,
        idempotency_key,
        prompt,
        ...(timeout_secs ? { timeout_secs } : {}),
        ...(continue_run_id ? { continue_run_id } : {}),
      }),
    observe: (run_id, after_observation_token, wait_secs) =>
      call(
        "observe_coding_agent",
        {
          run_id,
          ...(after_observation_token ? { after_observation_token } : {}),
          ...(wait_secs !== undefined ? { wait_secs } : {}),
        },
        (wait_secs ?? 0) * 1000 + 30_000,
      ),
    cancel: (run_id) => call("cancel_coding_agent", { run_id }),
    /** One page of a worktree run's recorded change (`get_coding_agent_changes`). */
    changes: (run_id, cursor, max_bytes) =>
      call("get_coding_agent_changes", {
        run_id,
        ...(cursor !== undefined ? { cursor } : {}),
        ...(max_bytes !== undefined ? { max_bytes } : {}),
      }),
    /** Observes with tokens until a terminal state with nothing more; returns the last result. */
    async observeToEnd(runId, token, timeoutMs, { onResult, waitSecs = 5 } = {}) {
      const deadline = Date.now() + timeoutMs;
      let cursor = token;
      let last;
      for (let i = 0; i < 1_000_000 && Date.now() < deadline; i++) {
        const r = await api.observe(runId, cursor, waitSecs);
        if (!r.ok) throw new Error(`observe_coding_agent failed: ${JSON.stringify(r.error)}`);
        last = r.value;
        onResult?.(last);
        cursor = last.observation_token;
        if (TERMINAL.has(last.state) && !last.has_more) return last;
      }
      throw new Error(`run ${runId} not terminal within ${timeoutMs} ms (last state ${last?.state})`);
    },
    async close() {
      try {
        await transport.terminateSession();
      } catch {
        // server may not support DELETE
      }
      await client.close();
    },
  };
  return api;
}
