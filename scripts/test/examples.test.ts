/** The example configs parse, and the MCP client snippets point at the demo's defaults. */
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { parse as parseToml } from "smol-toml";
import { describe, expect, it } from "vitest";
import { ROOT } from "./demo-stack.js";

const EXAMPLES = join(ROOT, "examples");

function files(dir: string, ext: string): string[] {
  return readdirSync(dir)
    .filter((f) => f.endsWith(ext))
    .map((f) => join(dir, f));
}

describe("examples", () => {
  it.each(files(join(EXAMPLES, "agents"), ".toml"))("%s is valid TOML with one agent and its env mapping", (file) => {
    const doc = parseToml(readFileSync(file, "utf8")) as {
      acp: { agents: { id: string; executable: string; env_from_env: Record<string, string> }[] };
    };
    expect(doc.acp.agents).toHaveLength(1);
    const agent = doc.acp.agents[0]!;
    expect(agent.id).toMatch(/^[a-z0-9][a-z0-9_-]{0,63}$/);
    expect(agent.executable.startsWith("/")).toBe(true);
    expect(agent.env_from_env.PATH).toBe("PATH");
    expect(agent.env_from_env).not.toHaveProperty("CODEX_PATH");
  });

  it.each([...files(join(EXAMPLES, "mcp-clients"), ".json"), ...files(join(EXAMPLES, "mcp-clients"), ".toml")])(
    "%s parses and targets the Server's /mcp endpoint",
    (file) => {
      const text = readFileSync(file, "utf8");
      if (file.endsWith(".json")) JSON.parse(text);
      else parseToml(text);
      expect(text).toContain("http://127.0.0.1:7420/mcp");
    },
  );
});
