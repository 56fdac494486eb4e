import { createHash } from "node:crypto";
import { appendFileSync } from "node:fs";
import { performance } from "node:perf_hooks";

/** One line of the ledger file (JSON, newline-terminated). */
export type LedgerEvent =
  | {
      event: "prompt";
      at_ms: number;
      hr_ms: number;
      session_id: string | null;
      prompt_sha256: string;
      pid: number;
    }
  | { event: "permission_outcome"; outcome: "cancelled" }
  | { event: "permission_outcome"; outcome: "selected"; option_id: string }
  | { event: "client_error"; method: string; code: number | null }
  | { event: "grandchild"; pid: number }
  | {
      event: "set_config_option";
      session_id: string | null;
      config_id: string | null;
      value: string | boolean | null;
      pid: number;
    }
  | { event: "cancel"; session_id: string | null; pid: number }
  | { event: "initialize"; pid: number }
  | { event: "session_load" | "session_resume"; session_id: string; found: boolean; pid: number }
  | {
      event: "credentials";
      ppid: number;
      identity: {
        uid: number | null;
        gid: number | null;
        groups: number[];
        cap_eff: string | null;
        cap_prm: string | null;
        cap_amb: string | null;
        cap_bnd: string | null;
        no_new_privs: string | null;
      };
      result: Record<string, { outcome: string; sha256?: string } | boolean>;
    }
  | { event: "fds"; pid: number; fds: { fd: number; target: string }[]; table_slots: number | null }
  | { event: "escaped"; how: "hopper"; pid: null; agent_pid: number }
  | {
      event: "escaped";
      how: "double_fork" | "setsid";
      pid: number;
      pgid: number | null;
      sid: number | null;
      agent_pid: number;
    }
  | { event: "leftovers"; uid: number; count: number }
  | { event: "process_read"; pid: number; result: Record<string, string | boolean> }
  | { event: "note_written"; name: string; uid: number }
  | { event: "note_read"; name: string; uid: number; result: string }
  | {
      event: "planted";
      tag: string;
      uid: number;
      wrote: Record<string, string>;
      shm_key: string | null;
      seen: Record<string, boolean>;
    }
  | { event: "sought"; tag: string; uid: number; found: Record<string, boolean>; temp: string }
  | { event: "git_worked"; name: string; uid: number; status: Record<string, number | string> }
  | { event: "git_planted"; uid: number; result: Record<string, number | string> }
  | { event: "git_planted_all"; uid: number; result: Record<string, string> }
  | { event: "file_edited"; path: string }
  | { event: "files_edited"; dir: string; count: number }
  | {
      event: "home_probed";
      tag: string;
      uid: number;
      env: Record<"HOME" | "USER" | "LOGNAME", string | null>;
      file: string | null;
      wrote: string | null;
      own: string;
      other: string | null;
    };

/**
 * Append-only, synchronous event log so tests can prove how often a prompt
 * reached the agent. Writes are `appendFileSync`, so a line is on disk before
 * the agent does anything else (including crashing).
 */
export class Ledger {
  constructor(private readonly file: string | undefined) {}

  append(event: LedgerEvent): void {
    if (this.file === undefined) return;
    appendFileSync(this.file, `${JSON.stringify(event)}\n`);
  }

  prompt(sessionId: string | null, promptText: string): void {
    this.append({
      event: "prompt",
      at_ms: Date.now(),
      hr_ms: performance.timeOrigin + performance.now(),
      session_id: sessionId,
      prompt_sha256: createHash("sha256").update(promptText, "utf8").digest("hex"),
      pid: process.pid,
    });
  }
}

/** Text of a prompt: its text content blocks concatenated (tolerates unvalidated params). */
export function promptTextOf(prompt: unknown): string {
  if (!Array.isArray(prompt)) return "";
  let text = "";
  for (const block of prompt as unknown[]) {
    if (typeof block === "object" && block !== null && "type" in block && block.type === "text") {
      if ("text" in block && typeof block.text === "string") text += block.text;
    }
  }
  return text;
}
