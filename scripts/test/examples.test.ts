/** The example configs parse, and the MCP client snippets point at the demo's defaults. */
import { mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { parseConfig } from "@webcodex/runner";
import { parse as parseToml } from "smol-toml";
import { describe, expect, it } from "vitest";
import { sharedTestDir } from "../../packages/runner/test/support/test-user.js";
import { ProcStack } from "../../packages/server/test/support/proc-stack.js";
import { REPO_ROOT as ROOT, SERVER_BIN } from "../test-support/index.js";

const EXAMPLES = join(ROOT, "examples");
const RUN_AS_LINE = /^run_as = \[.*\].*$/m;
/** An unprivileged account every Debian-like system has (uid 1), never root, nobody or this process's uid. */
const EXISTING_ACCOUNT = "daemon";

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

  it.each(files(join(EXAMPLES, "agents"), ".toml"))(
    "%s is a valid Runner agent entry: it parses as part of a whole config, forcing its permission mode where it has one",
    (file) => {
      // Not in /tmp: every run_as agent gets its own, empty /tmp, so a project root there is refused.
      const dir = sharedTestDir("wc-examples-");
      try {
        mkdirSync(join(dir, "proj"));
        // The node that runs the adapter: this machine's, wherever it is installed.
        const raw = readFileSync(file, "utf8");
        // Every real agent runs under a pool of users of its own (design §4.2); the example's pool users do not
        // exist here, so the parse gets an account this machine has (getent resolves it at load).
        expect(raw).toMatch(RUN_AS_LINE);
        const entry = raw
          .replace('executable = "/usr/bin/node"', `executable = ${JSON.stringify(process.execPath)}`)
          .replace(RUN_AS_LINE, `run_as = ["${EXISTING_ACCOUNT}"]`);
        const text = `[[projects]]\nid = "demo"\nroot = "proj"\nallow_patch = true\n${entry}`;
        const config = parseConfig(text, join(dir, "runner.toml"));
        const agent = config.acp.agents[0]!;
        expect(agent.runAs?.users.map((u) => u.user)).toEqual([EXISTING_ACCOUNT]);
        expect(agent.args[0]).toMatch(/^\/opt\/[a-z-]+\/node_modules\/.+\.js$/);
        if (agent.id === "gemini") expect(agent.args).toContain("--approval-mode=auto_edit");
        else expect(agent.forcedConfig).toHaveProperty("mode");
        // A run_as agent's HOME is its pool user's own, set by the Runner (config load refuses a mapped one).
        expect(agent.envFromEnv).not.toHaveProperty("HOME");
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );

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

/** Bound on a Server child process coming up and a stdio bridge answering on a loaded machine. */
const MCP_READY_MS = 60_000;

describe("examples/mcp-clients/README.md", () => {
  it(
    "names every tool and resource a real MCP client lists through the stdio bridge, and their counts",
    async () => {
      const stack = await new ProcStack({ runners: [], server: "child" }).init();
      const url = `http://127.0.0.1:${stack.port}/mcp`;
      try {
        // The stdio snippet's command, with this stack's URL and token.
        const snippet = JSON.parse(readFileSync(join(EXAMPLES, "mcp-clients", "mcp-servers-stdio.json"), "utf8"));
        const entry = snippet.mcpServers.webcodex as { command: string; args: string[] };
        const args = entry.args.map((a) =>
          a.endsWith("webcodex-server.js") ? SERVER_BIN : a === "http://127.0.0.1:7420/mcp" ? url : a,
        );
        expect(args.slice(1)).toEqual(["mcp-stdio", "--url", url, "--token-env", "WEBCODEX_TOKEN"]);
        const transport = new StdioClientTransport({
          command: process.execPath,
          args,
          env: { PATH: process.env.PATH ?? "", WEBCODEX_TOKEN: stack.principalTokens.get("alice") ?? "" },
          stderr: "pipe",
        });
        const client = new Client({ name: "examples-readme", version: "0" });
        await client.connect(transport);
        let tools: string[];
        let resources: string[];
        try {
          tools = (await client.listTools()).tools.map((t) => t.name);
          resources = (await client.listResources()).resources.map((r) => r.uri);
        } finally {
          await client.close();
        }
        const readme = readFileSync(join(EXAMPLES, "mcp-clients", "README.md"), "utf8");
        const section = readme.split("\n## What a model sees\n")[1]?.split("\n## ")[0] ?? "";
        const named = [...section.matchAll(/^- `([^`]+)`/gm)].map((m) => m[1] ?? "");
        expect(named.filter((n) => !n.includes("://")).sort()).toEqual([...tools].sort());
        expect(named.filter((n) => n.includes("://")).sort()).toEqual([...resources].sort());
        expect(section).toContain(`${tools.length} tools`);
        expect(section).toContain(`${resources.length} read-only resources`);
      } finally {
        await stack.stop();
      }
    },
    MCP_READY_MS * 2,
  );
});
