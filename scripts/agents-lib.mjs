/**
 * What `npm run probe:agents` (scripts/agents-probe.mjs) knows about each ACP agent of docs/agents/:
 * its pinned npm package, how it is started once installed into `.agents-cache/`, the env the offline
 * probe gives it, and the forced config its guide recommends — plus the pure parts the unit test
 * covers: the snapshot entry a probe result becomes, and the diff against the committed snapshot
 * (docs/agents/capabilities.json). No install, spawn or network here.
 */
import { join } from "node:path";

/** The Node 22 some agents need (Qwen Code, pi): installed next to them, like the hardening suite's. */
export const NODE22 = { pkg: "node", version: "22.23.3" };

/** Placeholder credential: lets an agent that checks only for a key's presence reach session/new offline. */
export const PLACEHOLDER = "webcodex-offline-placeholder";

const platform = { linux: "linux", darwin: "darwin", win32: "windows" }[process.platform] ?? process.platform;

/**
 * One row per agent. `entry(pkgDir)`: executable and args inside its cache folder (pkgDir =
 * `<cache>/node_modules`); `node`: 20 (this Node) or 22 (NODE22) when `executable` is a script's
 * interpreter; `pathDirs`: folders the agent must find on PATH; `env`: child variables the probe sets
 * (placeholders and switches only); `forced`: what its guide forces.
 */
export const AGENTS = [
  {
    id: "opencode",
    pkg: "opencode-ai",
    version: "1.18.33",
    // The npm package's bin is a stub its postinstall replaces by the platform package's binary; the
    // binary itself comes from the registry (optionalDependencies), so it is run directly.
    entry: (m) => ({ executable: join(m, `opencode-${platform}-${process.arch}`, "bin", "opencode"), args: ["acp"] }),
    env: {},
    forced: { mode: "build" },
  },
  {
    id: "qwen",
    pkg: "@qwen-code/qwen-code",
    version: "0.24.4",
    node: 22,
    entry: (m) => ({
      script: join(m, "@qwen-code", "qwen-code", "cli-entry.js"),
      args: ["--acp", "--auth-type=openai"],
    }),
    env: { OPENAI_API_KEY: PLACEHOLDER },
    forced: { mode: "auto-edit" },
  },
  {
    id: "copilot",
    pkg: "@github/copilot",
    version: "1.0.102",
    entry: (m) => ({
      executable: join(m, "@github", `copilot-${process.platform}-${process.arch}`, "copilot"),
      args: ["--acp", "--stdio", "--allow-tool=write"],
    }),
    // A GitHub login is checked online before session/new; its documented offline mode with a
    // custom provider (BYOK, never contacted by initialize and session/new) is not.
    env: {
      COPILOT_OFFLINE: "true",
      COPILOT_PROVIDER_BASE_URL: "http://127.0.0.1:9/v1",
      COPILOT_MODEL: "placeholder-model",
      COPILOT_AUTO_UPDATE: "false",
    },
    forced: { mode: "https://agentclientprotocol.com/protocol/session-modes#agent", allow_all: "off" },
  },
  {
    id: "auggie",
    pkg: "@augmentcode/auggie",
    version: "0.36.0",
    node: 20,
    entry: (m) => ({ script: join(m, "@augmentcode", "auggie", "augment.mjs"), args: ["--acp"] }),
    env: {
      AUGMENT_SESSION_AUTH: JSON.stringify({
        accessToken: PLACEHOLDER,
        tenantURL: "https://placeholder.api.augmentcode.com/",
        scopes: ["read", "write"],
      }),
      AUGMENT_DISABLE_AUTO_UPDATE: "1",
    },
    forced: {},
  },
  {
    id: "kilo",
    pkg: "@kilocode/cli",
    // 7.8.1 is the newest @kilocode/cli, but its platform packages were never published: 7.7.7 is the
    // newest that installs from the registry alone.
    version: "7.7.7",
    entry: (m) => ({
      executable: join(m, "@kilocode", `cli-${platform}-${process.arch}`, "bin", "kilo"),
      args: ["acp"],
    }),
    env: {},
    forced: { mode: "code" },
  },
  {
    id: "pi",
    pkg: "pi-acp",
    version: "0.0.34",
    // pi-acp starts `pi --mode rpc` from PATH: the pi CLI is pinned next to it.
    extra: ["@earendil-works/pi-coding-agent@1.6.0"],
    node: 22,
    entry: (m) => ({ script: join(m, "pi-acp", "dist", "index.js"), args: [] }),
    pathDirs: (m) => [join(m, ".bin")],
    env: { ANTHROPIC_API_KEY: PLACEHOLDER },
    forced: {},
  },
  {
    id: "claude",
    pkg: "@agentclientprotocol/claude-agent-acp",
    version: "0.101.0",
    node: 20,
    entry: (m) => ({ script: join(m, "@agentclientprotocol", "claude-agent-acp", "dist", "index.js"), args: [] }),
    env: { ANTHROPIC_API_KEY: PLACEHOLDER, DISABLE_AUTOUPDATER: "1", DISABLE_TELEMETRY: "1" },
    forced: { mode: "acceptEdits" },
  },
  {
    id: "codex",
    pkg: "@agentclientprotocol/codex-acp",
    version: "2.6.0",
    node: 20,
    entry: (m) => ({ script: join(m, "@agentclientprotocol", "codex-acp", "dist", "index.js"), args: [] }),
    env: { OPENAI_API_KEY: PLACEHOLDER, DEFAULT_AUTH_REQUEST: JSON.stringify({ methodId: "api-key" }) },
    forced: { mode: "agent" },
  },
  {
    id: "gemini",
    pkg: "@google/gemini-cli",
    version: "0.61.0",
    node: 20,
    entry: (m) => ({
      script: join(m, "@google", "gemini-cli", "bundle", "gemini.js"),
      args: ["--acp", "--approval-mode=auto_edit"],
    }),
    env: { GEMINI_API_KEY: PLACEHOLDER, GEMINI_CLI_NO_RELAUNCH: "true", GEMINI_CLI_TRUST_WORKSPACE: "true" },
    forced: {},
  },
];

/** The cache folder of one agent's pinned install. */
export function cacheDirOf(cacheRoot, agent) {
  return join(cacheRoot, `${agent.id}-${agent.version}`);
}

/** A config option's values (select: flattened groups; boolean: true/false). */
function optionValues(option) {
  if (option.type !== "select") return ["true", "false"];
  return (option.options ?? []).flatMap((o) => ("group" in o ? (o.options ?? []).map((g) => g.value) : [o.value]));
}

/** How an auth method would be used (same rule as the Runner's probe verdict). */
export function authKind(method) {
  const meta = method._meta ?? {};
  return method.type === "terminal" || "terminal-auth" in meta || meta.type === "terminal"
    ? "terminal login"
    : "authenticate";
}

/** The verdict's mode as one line (as formatVerdict prints it). */
function verdictMode(mode) {
  if (mode.kind === "option")
    return `${mode.value} (config option ${mode.optionId}, ${mode.forced ? "forced" : "not forced"})`;
  if (mode.kind === "session_modes") return `${mode.value} (session mode)`;
  return "(none)";
}

/**
 * The snapshot entry of one agent: what it advertised at initialize and session/new that decides how
 * WebCodex can run it, and the probe's verdict. Model lists (option values of category `model`, the
 * unstable `models` field) are not recorded: they follow the vendor's catalogue, not the version.
 */
export function snapshotEntry(agent, outcome) {
  const base = { package: agent.pkg, version: agent.version };
  if (outcome.status === "not_installable") return { ...base, status: "not_installable", why: outcome.why };
  const { probe, verdict } = outcome;
  if (!probe.ok && probe.initialize === undefined) {
    return { ...base, status: "failed", stage: probe.stage, why: probe.reason };
  }
  const init = probe.ok ? probe.initialize : probe.initialize;
  const entry = {
    ...base,
    status: probe.ok ? "ok" : probe.authRequired ? "auth_required" : "failed",
    agentInfo: { name: init.agentInfo?.name ?? null, version: init.agentInfo?.version ?? null },
    protocolVersion: init.protocolVersion,
    agentCapabilities: init.agentCapabilities ?? {},
    authMethods: (init.authMethods ?? []).map((m) => ({ id: m.id, kind: authKind(m) })),
  };
  if (!probe.ok) return { ...entry, stage: probe.stage };
  const session = probe.session;
  return {
    ...entry,
    session: {
      modes: session.modes
        ? { current: session.modes.currentModeId, available: session.modes.availableModes.map((m) => m.id) }
        : null,
      configOptions: (session.configOptions ?? []).map((o) =>
        o.category === "model"
          ? { id: o.id, type: o.type, category: "model" }
          : { id: o.id, type: o.type, category: o.category ?? null, current: o.currentValue, values: optionValues(o) },
      ),
      models: session.models ? "advertised" : null,
    },
    forced: probe.forced.ok ? "applied" : `not satisfiable: ${probe.forced.detail}`,
    verdict: { known: verdict.known, mode: verdictMode(verdict.mode), warnings: verdict.warnings },
  };
}

/** Key-sorted copy, so snapshots compare and print stably. */
export function sortKeys(value) {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value === null || typeof value !== "object") return value;
  return Object.fromEntries(
    Object.keys(value)
      .sort()
      .map((k) => [k, sortKeys(value[k])]),
  );
}

function flatten(value, path, out) {
  if (value !== null && typeof value === "object" && !Array.isArray(value) && Object.keys(value).length > 0) {
    for (const key of Object.keys(value)) flatten(value[key], path === "" ? key : `${path}.${key}`, out);
  } else {
    out.set(path, JSON.stringify(sortKeys(value)));
  }
  return out;
}

/**
 * The differences between the committed snapshot and this probe's, for the agents probed (`ids`):
 * `{ path, expected, actual }` with JSON text (undefined: absent on that side), in path order. An agent
 * missing from the snapshot is one difference at its id.
 */
export function diffSnapshots(expected, actual, ids) {
  const diffs = [];
  for (const id of ids) {
    const e = expected[id];
    const a = actual[id];
    if (e === undefined || a === undefined) {
      if (e !== a) diffs.push({ path: id, expected: e && "(recorded)", actual: a && "(probed)" });
      continue;
    }
    const fe = flatten(e, id, new Map());
    const fa = flatten(a, id, new Map());
    for (const path of new Set([...fe.keys(), ...fa.keys()])) {
      if (fe.get(path) !== fa.get(path)) diffs.push({ path, expected: fe.get(path), actual: fa.get(path) });
    }
  }
  return diffs.sort((x, y) => (x.path < y.path ? -1 : x.path > y.path ? 1 : 0));
}

/** The diff as lines: `- path: expected` / `+ path: actual`. */
export function formatDiff(diffs) {
  const lines = [];
  for (const d of diffs) {
    if (d.expected !== undefined) lines.push(`- ${d.path}: ${d.expected}`);
    if (d.actual !== undefined) lines.push(`+ ${d.path}: ${d.actual}`);
  }
  return lines.join("\n");
}
