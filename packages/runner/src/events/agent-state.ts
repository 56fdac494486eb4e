/**
 * ACP v1 session-state updates → `agent_state` event bodies (issue 12 §7):
 * `current_mode_update`, `config_option_update`, `available_commands_update`,
 * `session_info_update`, and Gemini CLI's mode change, which it sends as an
 * agent message chunk `[MODE_UPDATE] <mode>`. Each body is a bounded
 * snapshot: ids and values go through the normalizer's `label` (redacted,
 * cut to MAX_EVENT_LABEL_BYTES), lists stop at MAX_AGENT_STATE_ITEMS with
 * `truncated: true`; command descriptions and input hints are not forwarded.
 */
import type { SessionConfigOption, SessionUpdate } from "@agentclientprotocol/sdk";
import { MAX_AGENT_STATE_ITEMS, type RunEventBody } from "@webcodex/protocol";

export type AgentStateBody = Extract<RunEventBody, { kind: "agent_state" }>;
type Label = (text: string) => string;

/**
 * Gemini CLI (0.61) reports an approval-mode change as a whole agent message
 * chunk of exactly this form; its mode ids are `default`, `autoEdit`, `yolo`, `plan`.
 */
const MODE_UPDATE_CHUNK = /^\[MODE_UPDATE\] ([A-Za-z0-9_.:-]{1,128})$/;

/** The mode a `[MODE_UPDATE] <mode>` message chunk announces, or null for ordinary text. */
export function modeUpdateChunk(text: string): string | null {
  return MODE_UPDATE_CHUNK.exec(text.trim())?.[1] ?? null;
}

export function modeState(modeId: string, label: Label): AgentStateBody {
  return { kind: "agent_state", change: "mode", mode_id: label(modeId), truncated: false };
}

export function configOptionsState(options: readonly SessionConfigOption[], label: Label): AgentStateBody {
  const list = Array.isArray(options) ? options : [];
  return {
    kind: "agent_state",
    change: "config_options",
    config_options: list.slice(0, MAX_AGENT_STATE_ITEMS).map((o) => ({
      id: label(String(o?.id ?? "")),
      value: typeof o?.currentValue === "boolean" ? o.currentValue : label(String(o?.currentValue ?? "")),
    })),
    truncated: list.length > MAX_AGENT_STATE_ITEMS,
  };
}

/**
 * The body for one of the four session-state variants, or null when `update`
 * is none of them or lacks its required field (the caller counts it ignored).
 */
export function agentStateOf(update: SessionUpdate, label: Label): AgentStateBody | null {
  switch (update.sessionUpdate) {
    case "current_mode_update":
      return typeof update.currentModeId === "string" ? modeState(update.currentModeId, label) : null;
    case "config_option_update":
      return Array.isArray(update.configOptions) ? configOptionsState(update.configOptions, label) : null;
    case "available_commands_update": {
      const commands = Array.isArray(update.availableCommands) ? update.availableCommands : null;
      if (commands === null) return null;
      return {
        kind: "agent_state",
        change: "commands",
        commands: commands.slice(0, MAX_AGENT_STATE_ITEMS).map((c) => label(String(c?.name ?? ""))),
        truncated: commands.length > MAX_AGENT_STATE_ITEMS,
      };
    }
    case "session_info_update": {
      // `title` absent means unchanged (only updatedAt moved): nothing to report.
      if (update.title === undefined) return null;
      return {
        kind: "agent_state",
        change: "session_info",
        title: typeof update.title === "string" ? label(update.title) : null,
        truncated: false,
      };
    }
    default:
      return null;
  }
}
