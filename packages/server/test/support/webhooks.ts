/**
 * The webhook tests' shared steps: the operator's `webcodex-server webhooks …` command run as a child process,
 * a subscription added through it, and a receiver's requests verified with the `standardwebhooks` package (as a
 * real receiver does; a bad signature throws).
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { Webhook } from "standardwebhooks";
import { expect } from "vitest";
import { SERVER_BIN } from "../../../../scripts/test-support/index.js";
import type { WebhookReceiver } from "./webhook-receiver.js";

const run = promisify(execFile);

/** The first retry's delay in the webhook stacks (`[server.webhooks] retry_base_ms`): retries come within a second. */
export const RETRY_BASE_MS = 100;
export const WEBHOOK_TOML = `[server.webhooks]\nallow_loopback_http = true\nretry_base_ms = ${RETRY_BASE_MS}\n`;

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** `webcodex-server webhooks <args>`; never throws on a non-zero exit. */
export async function webhooksCli(args: string[]): Promise<CliResult> {
  try {
    const { stdout, stderr } = await run(process.execPath, [SERVER_BIN, "webhooks", ...args]);
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code?: number; stdout?: string; stderr?: string };
    return { code: e.code ?? -1, stdout: e.stdout ?? "", stderr: e.stderr ?? "" };
  }
}

/** `webhooks add … --json`, asserted to succeed: the subscription's id and its secret (shown once). */
export async function subscribe(
  configFile: string,
  principal: string,
  url: string,
  events: string,
): Promise<{ subscription_id: string; secret: string }> {
  const added = await webhooksCli([
    "add",
    "--config",
    configFile,
    "--principal",
    principal,
    "--url",
    url,
    "--events",
    events,
    "--json",
  ]);
  expect(added.code, added.stderr).toBe(0);
  return JSON.parse(added.stdout) as { subscription_id: string; secret: string };
}

export interface VerifiedEvent {
  type: string;
  data: Record<string, unknown>;
  id: string;
  status: number;
}

/** The receiver's requests, each verified with `secret` (throws on a bad signature). */
export function verified(r: WebhookReceiver, secret: string): VerifiedEvent[] {
  const wh = new Webhook(secret);
  return r.received.map((req) => ({
    ...(wh.verify(req.body, req.headers) as { type: string; data: Record<string, unknown> }),
    id: req.headers["webhook-id"] as string,
    status: req.status,
  }));
}
