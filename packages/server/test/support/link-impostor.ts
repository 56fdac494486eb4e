/**
 * The impostor of the link-security tests (design §5): a second real `webcodex-runner` that presents the
 * real Runner's token, with its own store and its own fake-agent ledger, and the `runner_link_audit` rows
 * the Server writes about it. The impostor is a runner of the ProcStack named "impostor", so its log is
 * `s.logs.get("impostor")`, the prompts its agent received are `s.prompts("impostor")`, and `s.stop()`
 * ends it like any Runner.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { ProcStack } from "./proc-stack.js";

export const IMPOSTOR = "impostor";

/**
 * Starts the impostor with `token` and a copy of `runnerConfig` (the real Runner's config text, by default
 * r1's file as it is now) whose store and agent ledger are its own. Does not wait: a refused Runner never
 * comes online.
 */
export async function startImpostor(
  s: ProcStack,
  token: string,
  runnerConfig = readFileSync(join(s.dir, "runner-r1.toml"), "utf8"),
): Promise<void> {
  writeFileSync(
    join(s.dir, `runner-${IMPOSTOR}.toml`),
    runnerConfig
      .replace('state_dir = "runner-state-r1"', `state_dir = "runner-state-${IMPOSTOR}"`)
      .replace(s.ledgerFile("r1"), s.ledgerFile(IMPOSTOR)),
  );
  s.tokens.set(IMPOSTOR, token);
  await s.startRunner(IMPOSTOR, [], {}, { waitOnline: false });
}

export interface LinkAuditRow {
  runner_id: string;
  event: string;
  count: number;
}

/** runner_link_audit, oldest first: from the in-process Server's store, or read-only from a child's file. */
export async function linkAudit(s: ProcStack): Promise<LinkAuditRow[]> {
  const query = "SELECT runner_id, event, count FROM runner_link_audit ORDER BY id";
  const rows = s.inproc ? await s.inproc.store.engine.all<LinkAuditRow>(query) : await s.stateRows<LinkAuditRow>(query);
  return rows.map((r) => ({ ...r, count: Number(r.count) }));
}

/** Refused hellos audited for `runnerId` (one row per runner and window carries their count). */
export async function refusedCount(s: ProcStack, runnerId = "r1"): Promise<number> {
  return (await linkAudit(s))
    .filter((r) => r.runner_id === runnerId && r.event === "link_refused_in_use")
    .reduce((sum, r) => sum + r.count, 0);
}
