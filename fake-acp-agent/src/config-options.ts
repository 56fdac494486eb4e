import { RequestError, type SessionConfigOption, type SetSessionConfigOptionRequest } from "@agentclientprotocol/sdk";

interface SelectSpec {
  readonly name: string;
  readonly category: string;
  readonly values: readonly (readonly [value: string, label: string])[];
  readonly initial: string;
}

/** Every select option the fake agent can advertise (`--config-options`). */
const CATALOG = {
  mode: {
    name: "Mode",
    category: "mode",
    values: [
      ["ask", "Ask"],
      ["code", "Code"],
    ],
    initial: "ask",
  },
  model: {
    name: "Model",
    category: "model",
    values: [
      ["fake-small", "Fake small"],
      ["fake-large", "Fake large"],
    ],
    initial: "fake-small",
  },
  reasoning_effort: {
    name: "Reasoning effort",
    category: "thought_level",
    values: [
      ["low", "Low"],
      ["medium", "Medium"],
      ["high", "High"],
    ],
    initial: "medium",
  },
} as const satisfies Record<string, SelectSpec>;

export type ConfigOptionId = keyof typeof CATALOG;
export const CONFIG_OPTION_IDS = Object.keys(CATALOG) as ConfigOptionId[];

export function isConfigOptionId(id: string): id is ConfigOptionId {
  return Object.hasOwn(CATALOG, id);
}

/**
 * Live config of one session. Setting `model` to `fake-large` also flips `mode`
 * to `code` (when `mode` is advertised), so clients can test re-asserting
 * forced values after a caller change.
 */
export class SessionConfig {
  private readonly current = new Map<ConfigOptionId, string>();
  private readonly specs = new Map<ConfigOptionId, SelectSpec>();

  /** `modeValues` (non-empty) replaces the values of `mode`; the first one is its initial value. */
  constructor(ids: readonly ConfigOptionId[], modeValues: readonly string[] = []) {
    for (const id of ids) {
      const base: SelectSpec = CATALOG[id];
      const spec: SelectSpec =
        id === "mode" && modeValues.length > 0
          ? { ...base, values: modeValues.map((v) => [v, v] as const), initial: modeValues[0] as string }
          : base;
      this.specs.set(id, spec);
      this.current.set(id, spec.initial);
    }
  }

  get isEmpty(): boolean {
    return this.current.size === 0;
  }

  toOptions(): SessionConfigOption[] {
    return [...this.current].map(([id, currentValue]) => {
      const spec = this.specs.get(id) as SelectSpec;
      return {
        type: "select",
        id,
        name: spec.name,
        category: spec.category,
        currentValue,
        options: spec.values.map(([value, name]) => ({ value, name })),
      };
    });
  }

  /** Applies one change; throws -32602 for an unknown id or a value the option does not list. */
  set(request: SetSessionConfigOptionRequest): SessionConfigOption[] {
    const { configId, value } = request;
    if (!isConfigOptionId(configId) || !this.current.has(configId)) {
      throw RequestError.invalidParams({ configId }, `unknown config option ${JSON.stringify(configId)}`);
    }
    const spec = this.specs.get(configId) as SelectSpec;
    if (typeof value !== "string" || !spec.values.some(([allowed]) => allowed === value)) {
      throw RequestError.invalidParams({ configId, value }, `value not offered by config option ${configId}`);
    }
    this.current.set(configId, value);
    if (configId === "model" && value === "fake-large" && this.current.has("mode")) {
      const mode = this.specs.get("mode") as SelectSpec;
      // "code" in the default catalog; with --mode-values, the last value.
      this.current.set("mode", mode.values[mode.values.length - 1]?.[0] ?? mode.initial);
    }
    return this.toOptions();
  }
}
