#!/usr/bin/env node
/**
 * Records what a real ACP agent sends during one prompt turn, as a fixture
 * for fake-acp-agent/fixtures/updates/ (`scenario: replay fixture=NAME`) and
 * the Runner's event-noise tests:
 *
 *   node scripts/record-updates.mjs --config runner.toml --provider claude \
 *     --prompt "Say hello." --turn-secs 20 --out fake-acp-agent/fixtures/updates/NAME.json
 *
 * The agent is spawned exactly as a run would (cleared env from
 * env_from_env, cwd = the first project's root, forced config applied); every
 * `session/update` from `session/new` on is kept in order, permission
 * requests are answered `cancelled` and kept as `permission` steps; after
 * --turn-secs the turn is cancelled. In the file the project root becomes
 * `<cwd>`, and every mapped env value (≥ 6 characters), the HOME path among
 * them, becomes `[redacted]`. Review the file before committing it.
 */
import { writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import {
  AcpClientConnection,
  loadConfig,
  Redactor,
  resolveChildEnv,
  sequenceConfig,
  spawnAgent,
} from "@webcodex/runner";

const { values } = parseArgs({
  options: {
    config: { type: "string" },
    provider: { type: "string" },
    prompt: { type: "string", default: "Say hello." },
    "turn-secs": { type: "string", default: "20" },
    out: { type: "string" },
  },
});
if (!values.config || !values.provider || !values.out) {
  process.stderr.write(
    "usage: record-updates.mjs --config FILE --provider ID --out FILE [--prompt TEXT] [--turn-secs N]\n",
  );
  process.exit(2);
}
const config = await loadConfig(values.config);
const agent = config.acp.agents.find((a) => a.id === values.provider);
const project = config.projects[0];
if (!agent || !project) throw new Error("no such provider, or no project");
const env = resolveChildEnv(agent, process.env);
if (!env.ok) throw new Error(`source variable ${env.missingSource} is not set`);

const steps = [];
const child = await spawnAgent({ agent, cwd: project.root, env: env.env });
const conn = new AcpClientConnection(child, {
  onSessionUpdate: (n) => steps.push({ update: n.update }),
  onPermissionRequest: async (params) => {
    const { sessionId: _sessionId, ...rest } = params;
    steps.push({ permission: rest });
    return { outcome: { outcome: "cancelled" } };
  },
  onUnsupportedRequest: () => {},
});
let stopReason = "(none)";
try {
  const init = await conn.initialize();
  if (init.kind !== "ok") throw new Error(`initialize: ${init.kind}`);
  const session = await conn.newSession(project.root);
  if (session.kind !== "ok") throw new Error(`session/new: ${session.kind}`);
  const sessionId = session.value.sessionId;
  const forced = await sequenceConfig({
    forced: agent.forcedConfig,
    caller: {},
    allowed: agent.allowedConfigOptions,
    initial: session.value.configOptions,
    set: (id, value) => conn.setConfigOption(sessionId, id, value),
  });
  if (!forced.ok) throw new Error("the forced config could not be applied");
  const response = conn.prompt(sessionId, values.prompt);
  const timer = setTimeout(() => void conn.cancel(sessionId), Number(values["turn-secs"]) * 1000);
  const answered = await Promise.race([
    response,
    new Promise((r) => setTimeout(() => r({ kind: "grace" }), Number(values["turn-secs"]) * 1000 + 15_000)),
  ]);
  clearTimeout(timer);
  stopReason =
    answered.kind === "ok"
      ? answered.value.stopReason
      : `(${answered.kind}${answered.code !== undefined ? ` ${answered.code}` : ""})`;
  const info = init.value.agentInfo;
  const fixture = {
    agent: info ? `${info.name} ${info.version}` : "(no agentInfo)",
    source: `Recorded by scripts/record-updates.mjs on ${new Date().toISOString().slice(0, 10)}: prompt ${JSON.stringify(values.prompt)}, turn cancelled after ${values["turn-secs"]} s if still running; the prompt ended ${stopReason}.`,
    steps,
    stopReason: answered.kind === "ok" ? answered.value.stopReason : "end_turn",
  };
  const redactor = new Redactor(Object.values(env.env));
  const text = redactor.redact(JSON.stringify(fixture, null, 1).split(project.root).join("<cwd>"));
  writeFileSync(values.out, `${text}\n`);
  process.stdout.write(`${steps.length} steps recorded; the prompt ended ${stopReason}\n`);
} finally {
  conn.close();
  await child.terminateTree(2000);
}
