/**
 * Session config sequencing (design §4.3 step 3), as one function over an
 * injected `set` so it is testable without a process:
 *
 *   1. reject caller keys that conflict with a forced key or are not allowed;
 *   2. apply and verify every forced key against the live `configOptions`
 *      (the refreshed list must show the value);
 *   3. apply each caller key only if the live option lists the value, and
 *      validate each refreshed list;
 *   4. after any set, re-assert forced values a side effect moved (of a caller
 *      key or of another forced key), then a final check that
 *      every forced and caller value is current.
 *
 * The recorded snapshot holds only the forced and caller keys, redacted.
 *
 * Any violation → failed / not_started / fix_input, before the prompt.
 * Empty or absent caller config sends no caller calls.
 */
import type { SessionConfigOption } from "@agentclientprotocol/sdk";
import {
  CONFIG_ID_PATTERN,
  type ConfigMap,
  type EffectiveConfigEntry,
  type FailureKind,
  MAX_CONFIG_VALUE_LENGTH,
  MAX_EFFECTIVE_CONFIG_ENTRIES,
} from "@webcodex/protocol";
import type { RequestOutcome } from "./session.js";

export type ConfigValue = string | boolean;

export type SequencingResult =
  | {
      ok: true;
      effective: EffectiveConfigEntry[];
      calls: number;
      /** The session's config options as the agent last announced them (a kept agent's next turn starts here). */
      live: readonly SessionConfigOption[];
    }
  | {
      ok: false;
      /** invalid_config: the caller's input; forced_config_unsatisfied: the operator's forced config. */
      failureKind: Extract<FailureKind, "invalid_config" | "forced_config_unsatisfied">;
      /** Fixed, secret-free detail naming the option id (never a value). */
      detail: string;
    }
  | { ok: false; failureKind: "fault"; outcome: Extract<RequestOutcome<unknown>, { kind: "fault" }> };

export interface SequencingInput {
  forced: Readonly<Record<string, ConfigValue>>;
  caller: ConfigMap;
  allowed: readonly string[];
  /** configOptions from session/new (null/undefined: the agent advertises none). */
  initial: readonly SessionConfigOption[] | null | undefined;
  set(id: string, value: ConfigValue): Promise<RequestOutcome<SessionConfigOption[]>>;
  /** Scrubs string values recorded in the snapshot (the run's redactor). */
  redact?: (text: string) => string;
}

function allValues(option: SessionConfigOption): string[] {
  if (option.type !== "select") return [];
  const out: string[] = [];
  for (const entry of option.options) {
    if ("group" in entry) for (const o of entry.options) out.push(o.value);
    else out.push(entry.value);
  }
  return out;
}

/** Whether `option` can take `value` at all (type match, listed select value). */
function offers(option: SessionConfigOption, value: ConfigValue): boolean {
  if (option.type === "boolean") return typeof value === "boolean";
  if (option.type === "select") return typeof value === "string" && allValues(option).includes(value);
  return false;
}

function current(options: readonly SessionConfigOption[], id: string): ConfigValue | undefined {
  const option = options.find((o) => o.id === id);
  if (!option) return undefined;
  return option.currentValue as ConfigValue;
}

/**
 * Bounded snapshot (MAX_EFFECTIVE_CONFIG_ENTRIES) of the current values of
 * `ids`, in that order — sequencing passes the forced and caller keys first,
 * then every other option the agent advertised — string values passed
 * through `redact`; ids/values outside the wire bounds are left out.
 */
export function snapshotConfig(
  options: readonly SessionConfigOption[],
  ids: readonly string[],
  redact: (text: string) => string = (text) => text,
): EffectiveConfigEntry[] {
  const out: EffectiveConfigEntry[] = [];
  for (const id of ids) {
    if (out.length >= MAX_EFFECTIVE_CONFIG_ENTRIES) break;
    if (!CONFIG_ID_PATTERN.test(id)) continue;
    const option = options.find((o) => o.id === id);
    if (!option) continue;
    const raw = option.currentValue as unknown;
    const value = typeof raw === "string" ? redact(raw) : raw;
    if (typeof value === "boolean" || (typeof value === "string" && value.length <= MAX_CONFIG_VALUE_LENGTH)) {
      out.push({ id, value });
    }
  }
  return out;
}

const q = (id: string) => JSON.stringify(id);

/** Step 1, also run before spawning: caller keys may not be forced keys and must be allowed. */
export function checkCallerKeys(
  forced: Readonly<Record<string, ConfigValue>>,
  caller: ConfigMap,
  allowed: readonly string[],
): { ok: true } | { ok: false; failureKind: "invalid_config"; detail: string } {
  for (const key of Object.keys(caller)) {
    if (Object.hasOwn(forced, key)) {
      return { ok: false, failureKind: "invalid_config", detail: `Config option ${q(key)} is forced by the operator.` };
    }
    if (!allowed.includes(key)) {
      return {
        ok: false,
        failureKind: "invalid_config",
        detail: `Config option ${q(key)} is not allowed for this provider.`,
      };
    }
  }
  return { ok: true };
}

export async function sequenceConfig(input: SequencingInput): Promise<SequencingResult> {
  const { forced, caller, allowed } = input;
  const forcedKeys = Object.keys(forced);
  const callerKeys = Object.keys(caller);
  let live: readonly SessionConfigOption[] = input.initial ?? [];
  let calls = 0;

  // 1. Caller keys: no conflicts with forced keys, only allowed ones.
  const keys = checkCallerKeys(forced, caller, allowed);
  if (!keys.ok) return keys;

  type SetFailure = Exclude<SequencingResult, { ok: true }>;
  const apply = async (
    id: string,
    value: ConfigValue,
    kind: "invalid_config" | "forced_config_unsatisfied",
  ): Promise<SetFailure | null> => {
    calls++;
    const outcome = await input.set(id, value);
    if (outcome.kind === "fault") return { ok: false, failureKind: "fault", outcome };
    if (outcome.kind === "rpc_error") {
      return {
        ok: false,
        failureKind: kind,
        // The numeric code stays in the Runner's log (acp/turn.ts logs every rejected setup request).
        detail: `The agent rejected config option ${q(id)}.`,
      };
    }
    live = outcome.value;
    if (current(live, id) !== value) {
      return { ok: false, failureKind: kind, detail: `The agent did not apply config option ${q(id)}.` };
    }
    return null;
  };

  // 2. Forced keys: advertised, offered, applied, verified.
  for (const key of forcedKeys) {
    const value = forced[key] as ConfigValue;
    const option = live.find((o) => o.id === key);
    if (!option) {
      return {
        ok: false,
        failureKind: "forced_config_unsatisfied",
        detail: `The agent does not advertise forced config option ${q(key)}.`,
      };
    }
    if (!offers(option, value)) {
      return {
        ok: false,
        failureKind: "forced_config_unsatisfied",
        detail: `The agent does not offer the forced value of config option ${q(key)}.`,
      };
    }
    const failure = await apply(key, value, "forced_config_unsatisfied");
    if (failure) return failure;
  }

  // 3. Caller keys: advertised and the value listed, then applied and verified.
  for (const key of callerKeys) {
    const value = caller[key] as ConfigValue;
    const option = live.find((o) => o.id === key);
    if (!option) {
      return {
        ok: false,
        failureKind: "invalid_config",
        detail: `The agent does not advertise config option ${q(key)}.`,
      };
    }
    if (!offers(option, value)) {
      return {
        ok: false,
        failureKind: "invalid_config",
        detail: `The agent does not offer the requested value of config option ${q(key)}.`,
      };
    }
    const failure = await apply(key, value, "invalid_config");
    if (failure) return failure;
  }

  // 4. Re-assert forced values moved by the side effects of any set (a caller key's, or another
  //    forced key's), then the final check.
  if (calls > 0) {
    for (const key of forcedKeys) {
      const value = forced[key] as ConfigValue;
      if (current(live, key) === value) continue;
      const failure = await apply(key, value, "forced_config_unsatisfied");
      if (failure) return failure;
    }
  }
  for (const key of forcedKeys) {
    if (current(live, key) !== forced[key]) {
      return {
        ok: false,
        failureKind: "forced_config_unsatisfied",
        detail: `Forced config option ${q(key)} did not hold.`,
      };
    }
  }
  for (const key of callerKeys) {
    if (current(live, key) !== caller[key]) {
      return {
        ok: false,
        failureKind: "invalid_config",
        detail: `Config option ${q(key)} could not be held together with the forced configuration.`,
      };
    }
  }
  // Every option the agent advertised (forced and caller keys first, so the bound never drops them).
  const ids = [...new Set([...forcedKeys, ...callerKeys, ...live.map((o) => o.id)])];
  return { ok: true, effective: snapshotConfig(live, ids, input.redact), calls, live };
}
