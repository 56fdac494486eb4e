import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { describe, expect, it } from "vitest";
import { REPO_ROOT } from "../../../scripts/test-support/index.js";
import { FAILPOINT_ENV, FAILPOINTS } from "../src/failpoints.js";

const MODULE = pathToFileURL(join(REPO_ROOT, "packages/runner/dist/failpoints.js")).href;

/** Load failpoints.js in a fresh process with `env`, then hit `before_barrier` after changing the env var. */
function probe(value: string | undefined) {
  const code = [
    `const { failpoint, activeFailpoint } = await import(${JSON.stringify(MODULE)});`,
    // A change after start-up must not arm anything: the value is read once, at load.
    `process.env.${FAILPOINT_ENV} = "after_admission";`,
    `failpoint("after_admission");`,
    `failpoint("before_barrier");`,
    `process.stdout.write("alive " + activeFailpoint());`,
  ].join("\n");
  const env: Record<string, string> = { PATH: process.env.PATH ?? "" };
  if (value !== undefined) env[FAILPOINT_ENV] = value;
  return spawnSync(process.execPath, ["--input-type=module", "-e", code], { env, encoding: "utf8" });
}

describe("failpoints", () => {
  it("are inert when the variable is unset or names no failpoint", () => {
    for (const value of [undefined, "", "bogus"]) {
      const result = probe(value);
      expect(result.signal).toBeNull();
      expect(result.stdout).toBe("alive null");
    }
  });

  it("SIGKILL the process at the armed failpoint only, read once at start-up", () => {
    const result = probe("before_barrier");
    expect(result.signal).toBe("SIGKILL");
    expect(result.stdout).toBe("");
  });

  it("are read from the environment in exactly one place of the Runner, and nowhere in the Server", () => {
    expect(FAILPOINTS).toEqual([
      "after_admission",
      "before_barrier",
      "after_barrier_before_prompt",
      "after_prompt_write",
      "after_terminal_before_projection",
      "owned_before_rename",
      "owned_after_rename",
      "owned_before_pack",
      "owned_after_pack",
      "change_after_branch",
      "change_after_store",
    ]);
    const readers: string[] = [];
    for (const pkg of ["packages/runner/src", "packages/server/src", "packages/protocol/src"]) {
      const dir = join(REPO_ROOT, pkg);
      for (const name of readdirSync(dir, { recursive: true }) as string[]) {
        if (!name.endsWith(".ts")) continue;
        // A use in code: the name as a string literal or a property access (comments do not count).
        const text = readFileSync(join(dir, name), "utf8");
        if (/["'`.]WEBCODEX_FAILPOINT\b|\[FAILPOINT_ENV\]/.test(text)) readers.push(`${pkg}/${name}`);
      }
    }
    expect(readers).toEqual(["packages/runner/src/failpoints.ts"]);
  });
});
