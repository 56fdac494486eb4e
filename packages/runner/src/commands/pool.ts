/**
 * `webcodex-runner pool --config FILE [release USER]`: which caller each run_as pool user serves
 * (process/user-bindings.ts), and the operator's way to free a user for any caller once its home and temp
 * files are clean. Release needs the daemon stopped: it reads the bindings once at start.
 */
import { FilePoolBindings } from "../process/user-bindings.js";
import { storeInUse } from "../store/open.js";
import { type Parsed, requireConfig, UsageError } from "./argv.js";

export async function pool(parsed: Parsed): Promise<number> {
  const cfg = await requireConfig(parsed);
  const [verb, user, ...extra] = parsed.positional;
  const bindings = new FilePoolBindings(cfg.runner.stateDir);
  if (verb === undefined) {
    const bound = bindings.load();
    const users = new Map<number, { user: string; agents: string[] }>();
    for (const agent of cfg.acp.agents) {
      for (const u of agent.runAs?.users ?? []) {
        const entry = users.get(u.uid) ?? { user: u.user, agents: [] };
        entry.agents.push(agent.id);
        users.set(u.uid, entry);
      }
    }
    if (users.size === 0) {
      process.stdout.write("no agent has a run_as pool\n");
      return 0;
    }
    const mode = cfg.acp.singleTenant
      ? "single_tenant: any user serves any caller"
      : `each user serves one caller; at most ${cfg.acp.maxUsersPerCaller ?? "half of a pool"} per caller; recycled after ${cfg.acp.bindingIdleDays} idle days`;
    const lines = [`run_as pool users (${mode})`];
    for (const [uid, { user: name, agents }] of users) {
      const b = bound.get(uid);
      const serves = b
        ? `caller ${b.tenant} since ${b.bound_at}, last used ${b.last_used_at ?? b.bound_at}`
        : "no caller yet";
      lines.push(`  ${name} (uid ${uid}; ${agents.join(", ")}): ${serves}`);
    }
    for (const [uid, b] of bound)
      if (!users.has(uid)) lines.push(`  ${b.user} (uid ${uid}; in no pool now): caller ${b.tenant}`);
    process.stdout.write(`${lines.join("\n")}\n`);
    return 0;
  }
  if (verb !== "release" || user === undefined || extra.length > 0) {
    throw new UsageError("pool takes no argument (list) or `release USER`");
  }
  if (storeInUse(cfg.runner.stateDir)) {
    process.stderr.write(
      `webcodex-runner: pool release: the Runner daemon on ${cfg.runner.stateDir} is running; stop it first (it reads ` +
        "the bindings once, at start). Nothing was changed.\n",
    );
    return 1;
  }
  const binding = [...bindings.load().values()].find((b) => b.user === user || String(b.uid) === user);
  if (!binding) {
    process.stderr.write(`webcodex-runner: pool release: ${user} serves no caller; nothing to release\n`);
    return 1;
  }
  bindings.release(binding.uid);
  process.stdout.write(
    `${binding.user} (uid ${binding.uid}) no longer serves caller ${binding.tenant}; its next run binds it to that ` +
      "run's caller. Nothing here removes what earlier runs left in its home and temp dirs: that must be clean already.\n",
  );
  return 0;
}
