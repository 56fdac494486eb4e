/** What the first line of a prompt asks for: `scenario: NAME key=value key="a b" ...`. */
export interface ScenarioCall {
  readonly name: string;
  readonly params: Readonly<Record<string, string>>;
  /** Tokens on the scenario line that are not `key=value`. */
  readonly stray: readonly string[];
}

export const DEFAULT_SCENARIO = "hello";

const SCENARIO_LINE = /^\s*scenario:\s*(\S+)(.*)$/;
const TOKEN = /([A-Za-z_][\w-]*)=(?:"([^"]*)"|(\S*))|(\S+)/g;

/** Parses the first line of the prompt; no `scenario:` line means `hello`. */
export function parseScenarioLine(promptText: string): ScenarioCall {
  const firstLine = promptText.split("\n", 1)[0] ?? "";
  const match = SCENARIO_LINE.exec(firstLine);
  if (!match) return { name: DEFAULT_SCENARIO, params: {}, stray: [] };
  const params: Record<string, string> = {};
  const stray: string[] = [];
  for (const token of (match[2] ?? "").matchAll(TOKEN)) {
    const [, key, quoted, bare, other] = token;
    if (key !== undefined) params[key] = quoted ?? bare ?? "";
    else if (other !== undefined) stray.push(other);
  }
  return { name: match[1] ?? DEFAULT_SCENARIO, params, stray };
}
