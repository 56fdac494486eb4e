/**
 * docs/agents/: each guide's `[[acp.agents]]` entry is a valid Runner agent entry (parsed as part of a
 * whole config), forces what the probe script verified, and names the version the script pins.
 */
import { mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { parseConfig } from "@webcodex/runner";
import { describe, expect, it } from "vitest";
import { sharedTestDir } from "../../packages/runner/test/support/test-user.js";
// @ts-expect-error plain .mjs scripts without type declarations
import { AGENTS } from "../agents-lib.mjs";
import { REPO_ROOT } from "../test-support/index.js";

const DIR = join(REPO_ROOT, "docs", "agents");
const RUN_AS_LINE = /^run_as = \[.*\].*$/m;
/** An unprivileged account every Debian-like system has (uid 1). */
const EXISTING_ACCOUNT = "daemon";
interface PinnedAgent {
  id: string;
  pkg: string;
  version: string;
  forced: Record<string, string>;
}
/** The agents whose guides live here (codex, claude and gemini keep theirs in examples/agents/). */
const GUIDED: PinnedAgent[] = (AGENTS as PinnedAgent[]).filter((a) => !["claude", "codex", "gemini"].includes(a.id));
const guides = readdirSync(DIR).filter((f) => f.endsWith(".md") && f !== "README.md");

function entryOf(file: string): string {
  const blocks = [...readFileSync(join(DIR, file), "utf8").matchAll(/```toml\n([\s\S]*?)```/g)].map((m) => m[1]!);
  const entries = blocks.filter((b) => b.includes("[[acp.agents]]"));
  expect(entries, file).toHaveLength(1);
  return entries[0]!;
}

describe("docs/agents guides", () => {
  it.each(guides)(
    "%s: its entry parses as a Runner agent under run_as, with PATH mapped and HOME not (the Runner sets it)",
    (file) => {
      const raw = entryOf(file);
      expect(raw).toMatch(RUN_AS_LINE);
      // Not in /tmp: every run_as agent gets its own, empty /tmp, so a project root there is refused.
      const dir = sharedTestDir("wc-agent-docs-");
      try {
        mkdirSync(join(dir, "proj"));
        // The executable is an install path; the parse checks it exists, so this machine's node stands in.
        const entry = raw
          .replace(/^executable = .*$/m, `executable = ${JSON.stringify(process.execPath)}`)
          .replace(RUN_AS_LINE, `run_as = ["${EXISTING_ACCOUNT}"]`);
        const config = parseConfig(`[[projects]]\nid = "demo"\nroot = "proj"\n${entry}`, join(dir, "runner.toml"));
        const agent = config.acp.agents[0]!;
        expect(Object.keys(agent.envFromEnv)).toContain("PATH");
        // A run_as agent's HOME is its pool user's own (config load refuses a mapped one).
        expect(Object.keys(agent.envFromEnv)).not.toContain("HOME");
        for (const key of Object.keys(agent.forcedConfig)) expect(agent.allowedConfigOptions).not.toContain(key);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );

  it.each(GUIDED)(
    "the guide of $id forces what probe:agents verified and names $pkg@$version",
    (agent: PinnedAgent) => {
      const file = guides.find((f) => readFileSync(join(DIR, f), "utf8").includes(`${agent.pkg}@${agent.version}`));
      expect(file, `${agent.pkg}@${agent.version}`).toBeDefined();
      const dir = sharedTestDir("wc-agent-docs-");
      try {
        mkdirSync(join(dir, "proj"));
        const entry = entryOf(file!)
          .replace(/^executable = .*$/m, `executable = ${JSON.stringify(process.execPath)}`)
          .replace(RUN_AS_LINE, `run_as = ["${EXISTING_ACCOUNT}"]`);
        const config = parseConfig(`[[projects]]\nid = "demo"\nroot = "proj"\n${entry}`, join(dir, "runner.toml"));
        expect(config.acp.agents[0]!.forcedConfig).toEqual(agent.forced);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
      const index = readFileSync(join(DIR, "README.md"), "utf8");
      expect(index).toContain(`(${file})`);
    },
  );
});
