/**
 * The configuration reference in docs/operating.md is checked against the code, so it cannot drift:
 * - Server: its tables list exactly the leaf keys of the exported `ServerConfigSchema` (both directions).
 * - Runner: every key its table lists is one the Runner's config parser accepts (a key the parser does not
 *   know is reported as "unknown key"), and every key runner.example.toml sets or shows commented out is
 *   in the table.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ConfigError, parseConfig } from "@webcodex/runner";
import { ServerConfigSchema } from "@webcodex/server";
import { describe, expect, it } from "vitest";
import { REPO_ROOT as ROOT } from "../test-support/index.js";

const OPERATING = readFileSync(join(ROOT, "docs", "operating.md"), "utf8");

/** The first cells of the table rows under `### heading` (up to the next heading). */
function tableKeyCells(markdown: string, heading: string): string[] {
  const start = markdown.indexOf(`\n### ${heading}\n`);
  if (start < 0) throw new Error(`docs/operating.md has no "### ${heading}" section`);
  const rest = markdown.slice(start + heading.length + 6);
  const end = rest.search(/\n#{2,3} /);
  const section = end < 0 ? rest : rest.slice(0, end);
  return section
    .split("\n")
    .filter((line) => line.startsWith("| `"))
    .map((line) => line.split("|")[1]!.trim());
}

/**
 * Dotted key paths of one cell: "`[server] host`" → server.host; "`[server.tls] cert_file`, `key_file`" →
 * server.tls.cert_file and server.tls.key_file; "`[[acp.agents]] run_as`" → acp.agents.run_as; a table of its own,
 * "`[acp.forced_config]`", → acp.forced_config.
 */
function keyPaths(cell: string): string[] {
  const parts = [...cell.matchAll(/`([^`]+)`/g)].map((m) => m[1]!);
  const head = /^\[\[?([a-z_.]+)\]\]?(?: ([a-z0-9_]+))?$/.exec(parts[0] ?? "");
  if (!head) throw new Error(`not a config key cell: ${cell}`);
  const section = head[1]!;
  if (head[2] === undefined) return [section];
  return [head[2], ...parts.slice(1)].map((key) => `${section}.${key}`);
}

function documented(...headings: string[]): string[] {
  return headings.flatMap((h) => tableKeyCells(OPERATING, h)).flatMap(keyPaths);
}

interface ZodNode {
  _zod: { def: { type: string; innerType?: ZodNode; element?: ZodNode; shape?: Record<string, ZodNode> } };
}

/** Leaf key paths of a zod object schema; arrays of objects contribute their element's keys under the array's key. */
function schemaLeaves(node: ZodNode, path: string[] = []): string[] {
  const def = node._zod.def;
  if (def.innerType) return schemaLeaves(def.innerType, path);
  if (def.type === "array" && def.element && def.element._zod.def.type !== "string") {
    const element = schemaLeaves(def.element, path);
    return element.length === 1 && element[0] === path.join(".") ? [path.join(".")] : element;
  }
  if (def.type === "object" && def.shape) {
    return Object.entries(def.shape).flatMap(([key, child]) => schemaLeaves(child, [...path, key]));
  }
  return [path.join(".")];
}

describe("docs/operating.md configuration reference", () => {
  it("lists exactly the Server's config keys", () => {
    const schema = schemaLeaves(ServerConfigSchema as unknown as ZodNode).sort();
    expect(schema).toContain("server.tls.cert_file");
    expect(schema).toContain("oauth.clients.redirect_uris");
    expect(documented("Server configuration", "OAuth").sort()).toEqual(schema);
  });

  function unknownKeyReport(text: string): string {
    try {
      parseConfig(text, join(ROOT, "config-reference-check.toml"));
      return "";
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      return err.message;
    }
  }

  /** A config holding just that key (any value: only the "unknown key" verdict matters here). */
  function configWith(path: string, arrays: ReadonlySet<string>): string {
    const segments = path.split(".");
    const key = segments.pop()!;
    const lines: string[] = [];
    for (let i = 1; i <= segments.length; i++) {
      const table = segments.slice(0, i).join(".");
      if (arrays.has(table)) lines.push(`[[${table}]]`);
    }
    const table = segments.join(".");
    if (table !== "" && !arrays.has(table)) lines.push(`[${table}]`);
    lines.push(arrays.has(path) ? `[[${path}]]` : `${key} = "x"`);
    return `${lines.join("\n")}\n`;
  }

  it("lists only keys the Runner accepts", () => {
    const keys = documented("Runner configuration");
    const arrays = new Set(
      tableKeyCells(OPERATING, "Runner configuration")
        .filter((cell) => cell.startsWith("`[["))
        .map((cell) => /^`\[\[([a-z_.]+)\]\]/.exec(cell)![1]!),
    );
    expect(keys.length).toBeGreaterThan(20);
    // The check can fail: a key the Runner does not have is reported.
    const canary = "no_such_key_7f3c91d2a8e64b05";
    expect(unknownKeyReport(configWith(`runner.${canary}`, arrays))).toContain(`runner.${canary}: unknown key`);
    for (const key of keys) {
      // A free-form table (forced config, env mapping) is checked with one entry in it.
      const text = configWith(/\.(forced_config|env_from_env)$/.test(key) ? `${key}.X` : key, arrays);
      expect(unknownKeyReport(text), `${key}\n${text}`).not.toMatch(/unknown key/);
    }
  });

  it("lists every key runner.example.toml shows", () => {
    const example = readFileSync(join(ROOT, "runner.example.toml"), "utf8");
    const keys = new Set(documented("Runner configuration"));
    let table = "";
    const shown: string[] = [];
    for (const raw of example.split("\n")) {
      const line = raw.replace(/^#\s?/, "");
      const header = /^\[\[?([a-z_.]+)\]\]?\s*(#.*)?$/.exec(line);
      if (header) {
        table = header[1]!;
        continue;
      }
      // An assignment, not prose that happens to contain " = " (a comment may say `x = true is required …`).
      const entry = /^([a-z0-9_]+)\s*=\s*("[^"]*"|\d+|true|false|\[[^\]]*\])\s*(#.*)?$/.exec(line);
      // Lines inside the free-form tables (forced config, env mapping) are values, not keys.
      if (entry && !/\.(forced_config|env_from_env)$/.test(table) && table !== "") shown.push(`${table}.${entry[1]}`);
    }
    expect(shown.length).toBeGreaterThan(20);
    for (const key of shown) expect([...keys], key).toContain(key);
  });
});
