/**
 * Tool calls through a real SDK MCP client for integration tests: `ok` asserts
 * the result is not an error and that the text copy equals structuredContent;
 * `toolError` asserts the error envelope and returns `{code, message, recovery_kind}`.
 */
import { createHash } from "node:crypto";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { expect } from "vitest";

export type Structured = Record<string, unknown>;
export interface ToolErr {
  code: string;
  message: string;
  recovery_kind: string;
  /** On a `capacity` the Runner explained (protocol capacity.ts). */
  capacity_reason?: string;
}

export const TERMINAL = new Set(["completed", "failed", "cancelled", "lost"]);

export async function callTool(client: Client, name: string, args: Record<string, unknown>) {
  return client.callTool({ name, arguments: args }, undefined, { timeout: 60_000 });
}

export async function ok(client: Client, name: string, args: Record<string, unknown>): Promise<Structured> {
  const result = await callTool(client, name, args);
  const text = (result.content as { type: string; text: string }[])[0]?.text ?? "";
  if (result.isError) throw new Error(`${name} failed: ${text}`);
  expect(JSON.parse(text)).toEqual(result.structuredContent);
  return result.structuredContent as Structured;
}

export async function toolError(client: Client, name: string, args: Record<string, unknown>): Promise<ToolErr> {
  const result = await callTool(client, name, args);
  const text = (result.content as { type: string; text: string }[])[0]?.text ?? "";
  expect(result.isError, `${name} should fail, got ${text}`).toBe(true);
  expect(result.structuredContent).toBeUndefined();
  const parsed = JSON.parse(text) as { error: ToolErr };
  expect(Object.keys(parsed)).toEqual(["error"]);
  return parsed.error;
}

/** Observe (bounded waits) until the run is terminal; returns the last observation. */
export async function observeToEnd(client: Client, runId: string, maxCalls = 200): Promise<Structured> {
  let token: string | undefined;
  for (let i = 0; i < maxCalls; i++) {
    const o = await ok(client, "observe_coding_agent", {
      run_id: runId,
      ...(token !== undefined ? { after_observation_token: token } : {}),
      wait_secs: 5,
    });
    token = o.observation_token as string;
    if (TERMINAL.has(o.state as string) && !o.has_more) return o;
  }
  throw new Error(`run ${runId} did not end`);
}

/** Observe until `until(observation)` holds. */
export async function observeUntil(
  client: Client,
  runId: string,
  until: (o: Structured) => boolean,
  maxCalls = 200,
): Promise<Structured> {
  let token: string | undefined;
  for (let i = 0; i < maxCalls; i++) {
    const o = await ok(client, "observe_coding_agent", {
      run_id: runId,
      ...(token !== undefined ? { after_observation_token: token } : {}),
      wait_secs: 2,
    });
    token = o.observation_token as string;
    if (until(o)) return o;
  }
  throw new Error(`run ${runId} never satisfied the condition`);
}

export function sha256(text: string): string {
  return createHash("sha256").update(text, "utf8").digest("hex");
}

/** Ledger lines of session/prompt requests whose prompt text is exactly `prompt`. */
export function promptsOf(ledger: Record<string, unknown>[], prompt: string): Record<string, unknown>[] {
  const sha = sha256(prompt);
  return ledger.filter((l) => l.event === "prompt" && l.prompt_sha256 === sha);
}
