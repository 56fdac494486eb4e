/**
 * Normalization of ACP `session/update` notifications into the protocol's
 * bounded RunEvent bodies (design §4.5). Nothing raw is forwarded: every
 * agent string passes through the run's Redactor (`label` / `redact`), which
 * makes it terminal-safe before redacting it; tool
 * activity is id/title/kind/status only, diffs become file_change events with
 * project-relative paths (outside paths masked), text is cut to the protocol
 * bounds, and every value of the child's mapped environment (≥ 6 chars) is
 * redacted before an event leaves this module. Consecutive message/reasoning
 * chunks coalesce into one event up to MAX_EVENT_TEXT_BYTES; pending text is
 * flushed by the owner (a short timer after the first chunk), when the bound
 * is reached, or when another kind of event arrives; a streamed (non-final)
 * flush holds back a tail that may begin a secret, so no secret is ever split
 * across two events. Other event bodies pass through an EventCoalescer
 * (events/coalescer.ts), which folds a body that only restates the one before
 * it (same tool call and status, consecutive usage or agent-state
 * snapshots) and drops nothing else; a tool call re-announced exactly as it
 * was last emitted, and empty message chunks, produce no event at all. The
 * session-state variants become `agent_state` events (events/agent-state.ts), and a
 * permission request for a tool call never announced first yields its
 * tool_activity. Unknown or ignored variants are only counted.
 */
import { isAbsolute, relative, resolve, sep } from "node:path";
import type {
  PermissionOption,
  RequestPermissionRequest,
  SessionUpdate,
  ToolCallContent,
} from "@agentclientprotocol/sdk";
import {
  MAX_EVENT_LABEL_BYTES,
  MAX_EVENT_TEXT_BYTES,
  MAX_PERMISSION_OPTIONS,
  MAX_PLAN_ENTRIES,
  MAX_USAGE_COST_AMOUNT,
  MAX_USAGE_TOKENS,
  OUTSIDE_PROJECT_PATH,
  type RunEventBody,
  type RunUsage,
  TOOL_KINDS,
  TOOL_STATUSES,
  truncateUtf8,
  utf8Length,
} from "@webcodex/protocol";
import { type AgentStateBody, agentStateOf, modeState, modeUpdateChunk } from "./agent-state.js";
import { EventCoalescer } from "./coalescer.js";
import type { Redactor } from "./redactor.js";

/** usage cost_currency: an ISO 4217 alphabetic code; anything else becomes null. */
const CURRENCY = /^[A-Z]{3}$/;
/** Tool calls whose title/kind/status are remembered to complete partial updates. */
const MAX_TRACKED_TOOL_CALLS = 1024;

/** A path relative to `root`, or OUTSIDE_PROJECT_PATH. Relative inputs are taken as relative to the root. */
export function relativizePath(root: string, path: string): string {
  const abs = isAbsolute(path) ? resolve(path) : resolve(root, path);
  const rel = relative(root, abs);
  if (rel === "") return ".";
  if (rel === ".." || rel.startsWith(`..${sep}`) || isAbsolute(rel)) return OUTSIDE_PROJECT_PATH;
  return rel;
}

type ToolKind = (typeof TOOL_KINDS)[number];
type ToolStatus = (typeof TOOL_STATUSES)[number];
const toolKind = (k: unknown): ToolKind => (TOOL_KINDS.includes(k as ToolKind) ? (k as ToolKind) : "other");
const toolStatus = (s: unknown): ToolStatus | undefined =>
  TOOL_STATUSES.includes(s as ToolStatus) ? (s as ToolStatus) : undefined;
const PERMISSION_KINDS = ["allow_once", "allow_always", "reject_once", "reject_always"] as const;
const PLAN_STATUSES = ["pending", "in_progress", "completed"] as const;
const PLAN_PRIORITIES = ["high", "medium", "low"] as const;
const oneOf = <T extends string>(values: readonly T[], v: unknown, fallback: T): T =>
  values.includes(v as T) ? (v as T) : fallback;

interface ToolState {
  title: string;
  kind: ToolKind;
  status: ToolStatus;
}

const toolSignature = (s: ToolState) => `${s.status}\u0000${s.kind}\u0000${s.title}`;

interface PendingText {
  kind: "agent_message" | "reasoning";
  text: string;
  bytes: number;
  truncated: boolean;
  /** onPending was called for this text (a carried tail alone waits for more text or a final flush). */
  scheduled: boolean;
}

export interface NormalizerOptions {
  projectRoot: string;
  redactor: Redactor;
  /** Receives every finished event body, in order. */
  emit: (body: RunEventBody) => void;
  /**
   * Called when new text or a held event starts pending; the owner must call
   * flushStreamed() soon after, and not before `delayMs` (0: at its next flush window).
   */
  onPending?: (delayMs: number) => void;
  /** Monotonic ms clock for the coalescer's holds (default performance.now). */
  now?: () => number;
}

export class EventNormalizer {
  #ignored = 0;
  /** The latest usage snapshot the agent sent (numbers and a currency code only), for the run summary. */
  #usage: RunUsage | null = null;
  #pending: PendingText | null = null;
  readonly #tools = new Map<string, ToolState>();
  /** tool_call_id label → signature of the last tool_activity that left (bounded like #tools). */
  readonly #announced = new Map<string, string>();
  /** change → JSON of the last agent_state snapshot that left, so an unchanged one is dropped. */
  readonly #lastState = new Map<AgentStateBody["change"], string>();
  readonly #o: NormalizerOptions;
  readonly #co: EventCoalescer;

  constructor(options: NormalizerOptions) {
    this.#o = options;
    this.#co = new EventCoalescer({
      emit: (body) => this.#out(body),
      schedule: (delayMs) => this.#o.onPending?.(delayMs),
      now: options.now ?? (() => performance.now()),
    });
  }

  get ignoredUpdates(): number {
    return this.#ignored;
  }

  /** The latest usage_update, as on the run summary; null until the agent sent one. */
  get usage(): RunUsage | null {
    return this.#usage;
  }

  /** Count an update that is not forwarded (unknown variant, other session, …). */
  ignore(): void {
    this.#ignored++;
  }

  label(text: string): string {
    return truncateUtf8(this.#o.redactor.redact(text), MAX_EVENT_LABEL_BYTES).text;
  }

  handle(update: SessionUpdate): void {
    switch (update.sessionUpdate) {
      case "agent_message_chunk":
      case "agent_thought_chunk": {
        const content = update.content as { type?: unknown; text?: unknown };
        if (content?.type !== "text" || typeof content.text !== "string") {
          this.ignore();
          return;
        }
        const mode = update.sessionUpdate === "agent_message_chunk" ? modeUpdateChunk(content.text) : null;
        if (mode !== null) {
          this.#state(modeState(mode, (t) => this.label(t)));
          return;
        }
        this.#text(update.sessionUpdate === "agent_message_chunk" ? "agent_message" : "reasoning", content.text);
        return;
      }
      case "tool_call": {
        const state: ToolState = {
          title: this.label(typeof update.title === "string" ? update.title : ""),
          kind: toolKind(update.kind),
          status: toolStatus(update.status) ?? "pending",
        };
        this.#tool(update.toolCallId, state, update.content);
        return;
      }
      case "tool_call_update": {
        const known = this.#tools.get(update.toolCallId);
        const state: ToolState = {
          title: typeof update.title === "string" ? this.label(update.title) : (known?.title ?? ""),
          kind: update.kind != null ? toolKind(update.kind) : (known?.kind ?? "other"),
          status: toolStatus(update.status) ?? known?.status ?? "pending",
        };
        this.#tool(update.toolCallId, state, update.content ?? undefined);
        return;
      }
      case "plan": {
        const entries = Array.isArray(update.entries) ? update.entries : [];
        this.#emit({
          kind: "plan",
          entries: entries.slice(0, MAX_PLAN_ENTRIES).map((e) => ({
            content: truncateUtf8(this.#o.redactor.redact(String(e.content ?? "")), MAX_EVENT_TEXT_BYTES).text,
            status: oneOf(PLAN_STATUSES, e.status, "pending"),
            priority: oneOf(PLAN_PRIORITIES, e.priority, "medium"),
          })),
          truncated: entries.length > MAX_PLAN_ENTRIES,
        });
        return;
      }
      case "usage_update": {
        const nat = (n: unknown) =>
          typeof n === "number" && Number.isSafeInteger(n) && n >= 0 && n <= MAX_USAGE_TOKENS ? n : null;
        const cost = update.cost ?? null;
        const amount =
          cost &&
          typeof cost.amount === "number" &&
          Number.isFinite(cost.amount) &&
          cost.amount >= 0 &&
          cost.amount <= MAX_USAGE_COST_AMOUNT
            ? cost.amount
            : null;
        // An ISO 4217 code or nothing: any other string is agent text.
        const currency =
          cost && typeof cost.currency === "string" && CURRENCY.test(cost.currency) ? cost.currency : null;
        const usage: RunUsage = {
          used_tokens: nat(update.used),
          context_size: nat(update.size),
          cost_amount: amount,
          cost_currency: amount === null ? null : currency,
        };
        this.#usage = usage;
        this.#emit({ kind: "usage", ...usage });
        return;
      }
      case "current_mode_update":
      case "config_option_update":
      case "available_commands_update":
      case "session_info_update": {
        const body = agentStateOf(update, (t) => this.label(t));
        if (body === null) this.ignore();
        else this.#state(body);
        return;
      }
      default:
        // user_message_chunk, notice, compaction_*, unknown.
        this.ignore();
    }
  }

  /** The permission_request event body for an ACP permission request. */
  permissionEvent(request: RequestPermissionRequest): RunEventBody {
    const id = String(request.toolCall?.toolCallId ?? "");
    const title =
      typeof request.toolCall?.title === "string"
        ? this.label(request.toolCall.title)
        : (this.#tools.get(id)?.title ?? "");
    const options = (Array.isArray(request.options) ? request.options : [])
      .slice(0, MAX_PERMISSION_OPTIONS)
      .filter((o: PermissionOption) => PERMISSION_KINDS.includes(o.kind as (typeof PERMISSION_KINDS)[number]))
      .map((o: PermissionOption) => ({
        option_id: this.label(String(o.optionId)),
        name: this.label(String(o.name)),
        kind: o.kind as (typeof PERMISSION_KINDS)[number],
      }));
    return { kind: "permission_request", tool_call_id: this.label(id), title, options };
  }

  /** Emit an event body built elsewhere (permission requests), keeping order with pending text. */
  emitBody(body: RunEventBody): void {
    this.#emit(body);
  }

  /**
   * A permission request: its tool call first, as a tool_activity, when the
   * agent never announced it (Gemini announces such tools only here), then
   * the permission_request event.
   */
  permissionRequest(request: RequestPermissionRequest): void {
    const call = request.toolCall;
    const id = String(call?.toolCallId ?? "");
    if (!this.#tools.has(id)) {
      const state: ToolState = {
        title: this.label(typeof call?.title === "string" ? call.title : ""),
        kind: toolKind(call?.kind),
        status: toolStatus(call?.status) ?? "pending",
      };
      this.#tool(id, state, call?.content ?? undefined);
    }
    this.#emit(this.permissionEvent(request));
  }

  /**
   * Push all pending coalesced text out (final flush: the run ends, or another
   * kind of event follows), including a held-back tail.
   */
  flush(): void {
    this.#flush(true);
    this.#co.release();
  }

  /**
   * Push pending text out, except a tail that may be the start of a secret
   * (see Redactor.heldSuffixLength): it stays pending and is redacted together
   * with the next chunk of the same kind, so a secret straddling a timer flush
   * or the size bound is never split across two events.
   */
  flushStreamed(): void {
    this.#flush(false);
    this.#co.releaseDue();
  }

  #flush(final: boolean): void {
    const pending = this.#pending;
    if (!pending) return;
    this.#pending = null;
    const redacted = this.#o.redactor.redact(pending.text);
    const held = final || pending.truncated ? 0 : this.#o.redactor.heldSuffixLength(redacted);
    let rest = redacted.slice(0, redacted.length - held);
    // A carried tail plus a full chunk may exceed one event: emit it in bounded pieces.
    while (rest !== "") {
      const piece = truncateUtf8(rest, MAX_EVENT_TEXT_BYTES).text;
      if (piece === "") break;
      rest = rest.slice(piece.length);
      this.#o.emit({ kind: pending.kind, text: piece, truncated: rest === "" && pending.truncated });
    }
    if (held > 0) {
      const carry = redacted.slice(redacted.length - held);
      this.#pending = { kind: pending.kind, text: carry, bytes: utf8Length(carry), truncated: false, scheduled: false };
    }
  }

  /** A finished non-text body: pending text first (order), then the coalescer. */
  #emit(body: RunEventBody): void {
    this.#flush(true);
    this.#co.offer(body);
  }

  /** Everything leaving the normalizer after the coalescer: remember what each tool call last showed. */
  #out(body: RunEventBody): void {
    if (body.kind === "tool_activity") {
      const key = body.tool_call_id;
      if (!this.#announced.has(key) && this.#announced.size >= MAX_TRACKED_TOOL_CALLS) {
        const oldest = this.#announced.keys().next().value;
        if (oldest !== undefined) this.#announced.delete(oldest);
      }
      this.#announced.set(key, toolSignature({ title: body.title, kind: body.tool_kind, status: body.status }));
    } else if (body.kind === "agent_state") {
      this.#lastState.set(body.change, JSON.stringify(body));
    }
    this.#o.emit(body);
  }

  /** An agent_state snapshot, unless it equals the last one of its kind that left (then: nothing new). */
  #state(body: AgentStateBody): void {
    const held = this.#co.held;
    const last =
      held?.kind === "agent_state" && held.change === body.change
        ? JSON.stringify(held)
        : this.#lastState.get(body.change);
    if (last !== JSON.stringify(body)) this.#emit(body);
  }

  #text(kind: PendingText["kind"], raw: string): void {
    // Empty chunks carry nothing (agents send them around tool calls): no event, no flush.
    if (raw === "") return;
    // A held event goes out before text that follows it.
    this.#co.release();
    if (this.#pending && this.#pending.kind !== kind) this.flush();
    const cut = truncateUtf8(this.#o.redactor.redact(raw), MAX_EVENT_TEXT_BYTES);
    const bytes = utf8Length(cut.text);
    let pending = this.#pending;
    if (pending && (pending.truncated || cut.truncated || pending.bytes + bytes > MAX_EVENT_TEXT_BYTES)) {
      // The bound is reached: what is pending becomes an event (minus a possible secret prefix, carried on).
      this.flushStreamed();
      pending = this.#pending;
    }
    if (pending) {
      pending.text += cut.text;
      pending.bytes += bytes;
      pending.truncated ||= cut.truncated;
    } else {
      pending = { kind, text: cut.text, bytes, truncated: cut.truncated, scheduled: false };
      this.#pending = pending;
    }
    if (!pending.scheduled) {
      pending.scheduled = true;
      this.#o.onPending?.(0);
    }
  }

  #tool(rawId: string, state: ToolState, content: ToolCallContent[] | undefined): void {
    const id = String(rawId ?? "");
    if (!this.#tools.has(id) && this.#tools.size >= MAX_TRACKED_TOOL_CALLS) {
      const oldest = this.#tools.keys().next().value;
      if (oldest !== undefined) this.#tools.delete(oldest);
    }
    this.#tools.set(id, state);
    const toolCallId = this.label(id);
    const held = this.#co.held;
    const shown =
      held?.kind === "tool_activity" && held.tool_call_id === toolCallId
        ? toolSignature({ title: held.title, kind: held.tool_kind, status: held.status })
        : this.#announced.get(toolCallId);
    // Re-announced exactly as last shown (e.g. an update carrying only content): no new tool_activity.
    if (shown !== toolSignature(state)) {
      this.#emit({
        kind: "tool_activity",
        tool_call_id: toolCallId,
        title: state.title,
        tool_kind: state.kind,
        status: state.status,
      });
    }
    for (const item of Array.isArray(content) ? content : []) {
      if (item.type === "diff" && typeof item.path === "string") {
        this.#emit({
          kind: "file_change",
          tool_call_id: toolCallId,
          path: this.label(relativizePath(this.#o.projectRoot, item.path)),
        });
      } else if (item.type === "terminal" && typeof item.terminalId === "string") {
        this.#emit({ kind: "terminal_activity", tool_call_id: toolCallId, terminal_id: this.label(item.terminalId) });
      }
    }
  }
}
