/**
 * The verdict that ends `webcodex-runner check --probe` (issue 20 §1): which
 * permission mode the agent's runs will really use once the forced config is
 * applied, and warnings for what is known to waste runs — a mode that asks
 * for permissions (WebCodex never grants one, so the agent waits for
 * `permission_timeout_secs` and may end the turn `completed` without the
 * change), a mode nobody forced, env an agent commonly needs that is not
 * mapped. Pure: probe results in, lines out. Names only, never env values.
 *
 * KNOWN_AGENTS is the small documented table (runner README "Probe
 * verdicts"); an agent is recognised by initialize's `agentInfo.name`.
 */
import type { InitializeResponse, NewSessionResponse, SessionConfigOption } from "@agentclientprotocol/sdk";
import type { EffectiveConfigEntry } from "@webcodex/protocol";
import type { AgentConfig } from "../config/config.js";

export interface KnownAgent {
  /** How the verdict names it. */
  readonly label: string;
  /** `agentInfo.name` values that identify it. */
  readonly names: readonly string[];
  /** Mode ids known to ask for permissions (or never to edit). */
  readonly askingModes: readonly string[];
  /** What to do instead, one line. */
  readonly advice: string;
  /** Groups of child env names: warn when no name of a group is mapped. */
  readonly env: readonly { readonly names: readonly string[]; readonly why: string }[];
  /**
   * Its session modes are not permission modes (pi-acp offers thinking levels as modes): what they are,
   * and what it does about permissions instead. The verdict then shows no effective mode.
   */
  readonly modesAreNot?: { readonly what: string; readonly permissions: string };
}

export const KNOWN_AGENTS: readonly KnownAgent[] = [
  {
    label: "claude-agent-acp",
    names: ["@agentclientprotocol/claude-agent-acp", "claude-agent-acp", "@zed-industries/claude-code-acp"],
    askingModes: ["default", "plan"],
    advice: 'force mode = "acceptEdits" in [acp.agents.forced_config]',
    env: [
      {
        names: ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"],
        why: "fine only with a `claude` login under HOME; without credentials session/new still works and every prompt fails after dispatch",
      },
    ],
  },
  {
    label: "codex-acp",
    names: ["@agentclientprotocol/codex-acp", "codex-acp", "@zed-industries/codex-acp"],
    askingModes: ["read-only", "workspace-write"],
    advice: 'force mode = "agent" in [acp.agents.forced_config]',
    env: [
      {
        names: ["OPENAI_API_KEY", "CODEX_API_KEY"],
        why: "fine only with a `codex login` (auth.json under CODEX_HOME or HOME/.codex); without credentials session/new fails with -32000",
      },
    ],
  },
  {
    label: "gemini-cli",
    names: ["gemini-cli", "@google/gemini-cli"],
    askingModes: ["default", "plan"],
    advice: "start it with --approval-mode=auto_edit in args (it has no config option to force)",
    env: [
      { names: ["GEMINI_API_KEY", "GOOGLE_API_KEY"], why: "fine only with a Google login under HOME" },
      {
        names: ["GEMINI_CLI_NO_RELAUNCH"],
        why: "GEMINI_CLI_NO_RELAUNCH=true (else it relaunches itself under a wrapper that ignores SIGTERM)",
      },
    ],
  },
  // Issue 44: the agents below were probed offline (initialize, session/new); docs/agents/ has a guide each.
  {
    label: "opencode",
    names: ["OpenCode", "opencode"],
    askingModes: ["plan"],
    advice: 'force mode = "build" in [acp.agents.forced_config]',
    env: [],
  },
  {
    label: "kilo",
    names: ["Kilo", "kilo", "@kilocode/cli"],
    askingModes: ["ask", "plan"],
    advice: 'force mode = "code" in [acp.agents.forced_config]',
    env: [],
  },
  {
    label: "qwen-code",
    names: ["qwen-code"],
    askingModes: ["default", "plan"],
    advice: 'force mode = "auto-edit" in [acp.agents.forced_config]',
    env: [
      {
        names: ["OPENAI_API_KEY"],
        why: "fine only with a login under HOME/.qwen; without one session/new fails with auth_required (-32000)",
      },
    ],
  },
  {
    label: "copilot",
    names: ["Copilot", "@github/copilot"],
    // Its mode values are URLs; edits ask unless --allow-tool=write is in args (allow_all = "on" approves
    // shell commands and URLs too).
    askingModes: ["https://agentclientprotocol.com/protocol/session-modes#plan"],
    advice:
      'force mode = "https://agentclientprotocol.com/protocol/session-modes#agent" and allow_all = "off", and start it with --allow-tool=write in args',
    env: [
      {
        names: ["COPILOT_GITHUB_TOKEN", "GH_TOKEN", "GITHUB_TOKEN", "COPILOT_PROVIDER_BASE_URL"],
        why: "fine only with a `copilot login` under HOME/.copilot (or COPILOT_HOME); without one, or offline, session/new fails with auth_required (-32000)",
      },
    ],
  },
  {
    label: "auggie",
    names: ["auggie"],
    askingModes: ["ask"],
    advice: 'leave it in session mode "default" (it has no config option to force)',
    env: [
      {
        names: ["AUGMENT_SESSION_AUTH"],
        why: "fine only with an `auggie login` under HOME/.augment; without one session/new fails with auth_required (-32000)",
      },
    ],
  },
  {
    label: "pi-acp",
    names: ["pi-acp"],
    askingModes: [],
    advice: "run it only under run_as users of its own",
    env: [],
    modesAreNot: {
      what: "thinking levels",
      permissions: "pi asks for no permission: every tool, shell commands included, runs unasked",
    },
  },
];

/** ACP's `auth_required` error code: the agent refuses session/new until the client authenticates. */
export const ACP_AUTH_REQUIRED = -32000;
/** Auth methods named in the auth_required verdict; the rest are counted. */
const MAX_AUTH_METHODS_NAMED = 8;

type AuthMethod = NonNullable<InitializeResponse["authMethods"]>[number];

/**
 * How an advertised auth method would be used: a terminal login the client runs (ACP `type: "terminal"`,
 * or the `terminal-auth` / `type: "terminal"` hints agents put in `_meta`), or the `authenticate` request
 * (`agent`, the default). The Runner does neither.
 */
export function authMethodKind(method: AuthMethod): "terminal login" | "authenticate" {
  const meta = (method as { _meta?: Record<string, unknown> | null })._meta ?? {};
  const metaType = (meta as { type?: unknown }).type;
  if ((method as { type?: unknown }).type === "terminal" || "terminal-auth" in meta || metaType === "terminal") {
    return "terminal login";
  }
  return "authenticate";
}

/**
 * The probe's reason when session/new is refused with auth_required: what the agent offers, and that the
 * Runner uses none of it (it never sends `authenticate` and runs no terminal login), so the login must
 * already be there — under the HOME it gets, or in a mapped variable.
 */
export function authRequiredReason(agent: AgentConfig, initialize: InitializeResponse): string {
  const methods = initialize.authMethods ?? [];
  const named = methods
    .slice(0, MAX_AUTH_METHODS_NAMED)
    .map((m) => `${String(m.id)} (${authMethodKind(m)})`)
    .join(", ");
  const more = methods.length > MAX_AUTH_METHODS_NAMED ? ` and ${methods.length - MAX_AUTH_METHODS_NAMED} more` : "";
  const known = knownAgent(initialize.agentInfo);
  const unmapped = (known?.env ?? []).filter((g) => !g.names.some((n) => Object.hasOwn(agent.envFromEnv, n)));
  const hint = unmapped.length > 0 ? ` (${known?.label}: ${unmapped.map((g) => g.names.join(" / ")).join("; ")})` : "";
  return (
    `session/new refused: the agent requires authentication (ACP auth_required, ${ACP_AUTH_REQUIRED}); ` +
    `it advertises ${methods.length === 0 ? "no auth method" : `auth methods ${named}${more}`}. ` +
    "The Runner never sends authenticate and runs no terminal login, so every run would fail before dispatch: " +
    `log the agent in beforehand under the HOME it gets, or map its credential variable in env_from_env${hint}`
  );
}

/** Env almost every agent needs: settings, logins and caches live under HOME (set by the Runner under run_as). */
const COMMON_ENV = [{ names: ["HOME"], why: "HOME (agents keep settings, logins and caches there)" }];

/** Config option ids (besides category "mode") that set how much the agent may do unasked. */
const PERMISSION_OPTION = /^(mode|permission[s_-]?mode|approval[s_-]?(mode|policy)|sandbox([_-]?mode)?)$/i;

/** How the forced config fared when the probe applied it like a run would. */
export type ForcedOutcome = { ok: true; effective: readonly EffectiveConfigEntry[] } | { ok: false; detail: string };

export interface Verdict {
  readonly known: string | null;
  /** The mode runs will use, and where it comes from. */
  readonly mode:
    | { kind: "option"; optionId: string; value: string; forced: boolean }
    | { kind: "session_modes"; value: string }
    | { kind: "none" };
  readonly warnings: readonly string[];
}

function modeOption(options: readonly SessionConfigOption[]): SessionConfigOption | undefined {
  return options.find((o) => o.category === "mode") ?? options.find((o) => PERMISSION_OPTION.test(o.id));
}

export function knownAgent(info: InitializeResponse["agentInfo"]): KnownAgent | undefined {
  const name = info?.name;
  return typeof name === "string" ? KNOWN_AGENTS.find((k) => k.names.includes(name)) : undefined;
}

export function probeVerdict(input: {
  agent: AgentConfig;
  initialize: InitializeResponse;
  session: NewSessionResponse;
  forced: ForcedOutcome;
}): Verdict {
  const { agent, session, forced } = input;
  const known = knownAgent(input.initialize.agentInfo);
  const warnings: string[] = [];
  if (!forced.ok) {
    warnings.push(
      `the forced config cannot be applied (${forced.detail}); every run would fail forced_config_unsatisfied`,
    );
  }

  const options = session.configOptions ?? [];
  const option = modeOption(options);
  let mode: Verdict["mode"] = { kind: "none" };
  if (option !== undefined) {
    const isForced = Object.hasOwn(agent.forcedConfig, option.id);
    const applied = forced.ok ? forced.effective.find((e) => e.id === option.id)?.value : undefined;
    const value = String(isForced && applied !== undefined ? applied : option.currentValue);
    mode = { kind: "option", optionId: option.id, value, forced: isForced };
    if (!isForced) {
      warnings.push(
        `the agent advertises a mode option (${option.id}, now ${value}) and no forced_config sets it: runs get whatever the agent defaults to${known ? `; ${known.advice}` : ""}`,
      );
    }
  } else if (session.modes && known?.modesAreNot !== undefined) {
    warnings.push(
      `its session modes (now ${String(session.modes.currentModeId)}) are ${known.modesAreNot.what}, not permission modes: ${known.modesAreNot.permissions} — ${known.advice}`,
    );
  } else if (session.modes) {
    mode = { kind: "session_modes", value: String(session.modes.currentModeId) };
    if (known === undefined) {
      warnings.push(
        `the agent advertises session modes (now ${mode.value}) but no config option to force one: set its approval mode through its own args or settings`,
      );
    }
  }
  if (known !== undefined && mode.kind !== "none" && known.askingModes.includes(mode.value)) {
    warnings.push(
      `mode ${mode.value} is known to ask for permissions (${known.label}: ${known.askingModes.join(", ")}); WebCodex never grants them, so edits wait for permission_timeout_secs and a run may end completed without the change — ${known.advice}`,
    );
  }

  // A run_as agent's HOME is its pool user's own, set by the Runner (process/run-as.ts runAsEnv), never mapped.
  const common = agent.runAs === null ? COMMON_ENV : [];
  for (const group of [...common, ...(known?.env ?? [])]) {
    if (!group.names.some((n) => Object.hasOwn(agent.envFromEnv, n))) {
      warnings.push(`env: ${group.names.join(" / ")} not mapped in env_from_env — ${group.why}`);
    }
  }
  return { known: known?.label ?? null, mode, warnings };
}

/** The verdict as the probe's closing lines. */
export function formatVerdict(verdict: Verdict): string {
  const mode =
    verdict.mode.kind === "option"
      ? `${verdict.mode.value} (config option ${verdict.mode.optionId}, ${verdict.mode.forced ? "forced" : "not forced"})`
      : verdict.mode.kind === "session_modes"
        ? `${verdict.mode.value} (session mode; not settable by forced_config)`
        : "(the agent advertises no mode)";
  let text = `verdict${verdict.known ? ` (${verdict.known})` : ""}: effective mode ${mode}\n`;
  for (const w of verdict.warnings) text += `  warning: ${w}\n`;
  if (verdict.warnings.length === 0) text += "  no warnings\n";
  return text;
}
