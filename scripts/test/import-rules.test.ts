/**
 * The import rules `npm run lint` checks (.dependency-cruiser.mjs, with the per-folder rules generated from the
 * folders' READMEs by scripts/lint/folder-rules.mjs) fail on a planted forbidden import. Each case runs the real
 * dependency-cruiser CLI with the real rule set on a small fixture tree in a temp dir, shaped like the repository
 * (packages/server/src/<folder>/README.md …): the real tree is never touched.
 */
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { folderRules } from "../lint/folder-rules.mjs";
import { REPO_ROOT } from "../test-support/index.js";

const DEPCRUISE = join(REPO_ROOT, "node_modules/dependency-cruiser/bin/dependency-cruise.mjs");
/** One depcruise run on the fixture; the machine is shared and loaded. */
const DEPCRUISE_TIMEOUT_MS = 120_000;

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** The fixture: two Server folders with one allowed arrow, one known exception, and a CLI package. */
function baseTree(): Record<string, string> {
  return {
    "tsconfig.json": JSON.stringify({
      compilerOptions: { module: "NodeNext", moduleResolution: "NodeNext", strict: true },
      include: ["packages/*/src/**/*.ts"],
    }),
    "packages/protocol/src/index.ts": "export const PROTOCOL = 1;\n",
    // Workspace packages by name: node_modules/@webcodex/* link to them (fixture() makes the links); each
    // exports "." only, as ours do.
    "packages/protocol/package.json": JSON.stringify({
      name: "@webcodex/protocol",
      type: "module",
      exports: { ".": { import: "./dist/index.js" } },
    }),
    "packages/protocol/dist/index.js": "export const PROTOCOL = 1;\n",
    "packages/protocol/dist/vocab.js": "export const VOCAB = 1;\n",
    "packages/server/package.json": JSON.stringify({
      name: "@webcodex/server",
      type: "module",
      exports: { ".": { import: "./dist/index.js" } },
    }),
    "packages/server/dist/index.js": "export const SERVER = 1;\n",
    "packages/server/src/config.ts": "export const CONFIG = 1;\n",
    "packages/server/src/state/README.md": "# state/\n\nMay import: nothing\n",
    "packages/server/src/state/engine.ts": "export const ENGINE = 1;\n",
    "packages/server/src/runs/README.md": [
      "# runs/",
      "",
      "May import: `config.ts`, `state/`",
      "",
      "Known exceptions (to be removed):",
      "",
      "- `runs/tools.ts` → `mcp/shared.ts`: the fixture's named exception.",
      "",
    ].join("\n"),
    "packages/server/src/runs/api.ts": 'import { ENGINE } from "../state/engine.js";\nexport const API = ENGINE;\n',
    "packages/server/src/runs/tools.ts": 'import { SHARED } from "../mcp/shared.js";\nexport const TOOLS = SHARED;\n',
    "packages/server/src/mcp/README.md": "# mcp/\n\nMay import: `runs/api.ts`\n",
    "packages/server/src/mcp/shared.ts": "export const SHARED = 1;\n",
    "packages/server/src/mcp/http.ts": 'import { API } from "../runs/api.js";\nexport const HTTP = API;\n',
    "packages/runner/src/store/README.md": "# store/\n\nMay import: nothing\n",
    "packages/runner/src/store/open.ts":
      'import { PROTOCOL } from "@webcodex/protocol";\nexport const OPEN = PROTOCOL;\n',
    "packages/cli/src/main.ts": "export const MAIN = 1;\n",
  };
}

/** Writes the tree into a fresh temp dir with its own node_modules links and a config using the real rules. */
function fixture(tree: Record<string, string>): string {
  const root = mkdtempSync(join(tmpdir(), "wc-import-rules-"));
  dirs.push(root);
  for (const [path, text] of Object.entries(tree)) {
    mkdirSync(dirname(join(root, path)), { recursive: true });
    writeFileSync(join(root, path), text);
  }
  mkdirSync(join(root, "node_modules/@webcodex"), { recursive: true });
  symlinkSync("../../packages/protocol", join(root, "node_modules/@webcodex/protocol"));
  symlinkSync("../../packages/server", join(root, "node_modules/@webcodex/server"));
  const realConfig = pathToFileURL(join(REPO_ROOT, ".dependency-cruiser.mjs")).href;
  writeFileSync(
    join(root, ".dependency-cruiser.mjs"),
    `import { configFor } from ${JSON.stringify(realConfig)};\nexport default configFor(${JSON.stringify(root)});\n`,
  );
  return root;
}

/** `depcruise` as `npm run lint` runs it (err reporter): its exit code and output. */
function depcruise(root: string): Promise<{ code: number; out: string }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [DEPCRUISE, "--config", ".dependency-cruiser.mjs", "--output-type", "err", "packages"],
      { cwd: root, timeout: DEPCRUISE_TIMEOUT_MS },
      (error, stdout, stderr) => {
        const code = error === null ? 0 : typeof error.code === "number" ? error.code : -1;
        resolve({ code, out: `${stdout}${stderr}` });
      },
    );
  });
}

describe("the import rules of npm run lint", () => {
  it("pass the fixture as written: allowed arrows and a live known exception", async () => {
    const { code, out } = await depcruise(fixture(baseTree()));
    expect(out).toContain("no dependency violations found");
    expect(code).toBe(0);
  }, 150_000);

  it("fail on planted forbidden imports, naming each rule", async () => {
    const tree = baseTree();
    // An upward arrow that also closes a circle: state/ may import nothing.
    tree["packages/server/src/state/engine.ts"] =
      'import { API } from "../runs/api.js";\nexport const ENGINE = 1;\nexport const LOOP = API;\n';
    // A file of a folder its README does not list (mcp/ may import runs/api.ts only).
    tree["packages/server/src/mcp/http.ts"] =
      'import { API } from "../runs/api.js";\nimport { TOOLS } from "../runs/tools.js";\nexport const HTTP = [API, TOOLS];\n';
    // The CLI reaching into the Server's src/ by a relative path, and importing the Server by name.
    tree["packages/cli/src/main.ts"] =
      'import { API } from "../../server/src/runs/api.js";\nimport { SERVER } from "@webcodex/server";\nexport const MAIN = [API, SERVER];\n';
    // A file the protocol package does not export.
    tree["packages/runner/src/store/open.ts"] =
      'import { RunState } from "@webcodex/protocol/dist/vocab.js";\nexport const OPEN = RunState;\n';
    const { code, out } = await depcruise(fixture(tree));
    expect(code).not.toBe(0);
    expect(out).toMatch(
      /folder:server\/state: packages\/server\/src\/state\/engine\.ts → packages\/server\/src\/runs\/api\.ts/,
    );
    expect(out).toContain("no-circular");
    expect(out).toMatch(
      /folder:server\/mcp: packages\/server\/src\/mcp\/http\.ts → packages\/server\/src\/runs\/tools\.ts/,
    );
    expect(out).toMatch(/cli-mcp-only: packages\/cli\/src\/main\.ts → packages\/server\/src\/runs\/api\.ts/);
    expect(out).toMatch(/cli-mcp-only: packages\/cli\/src\/main\.ts → packages\/server\/dist\/index\.js/);
    expect(out).toContain("no-relative-path-into-another-package");
    expect(out).toMatch(
      /not-to-unresolvable: packages\/runner\/src\/store\/open\.ts → @webcodex\/protocol\/dist\/vocab\.js/,
    );
  }, 150_000);

  it("fail when a known exception is gone, so its README line goes with it", async () => {
    const tree = baseTree();
    tree["packages/server/src/runs/tools.ts"] = "export const TOOLS = 1;\n";
    const { code, out } = await depcruise(fixture(tree));
    expect(code).not.toBe(0);
    expect(out).toContain("exception-still-needed:server/runs/tools.ts->mcp/shared.ts");
  }, 150_000);

  it("refuse a folder whose README has no May import line, and a tie made of two May import lines", () => {
    const missing = baseTree();
    missing["packages/server/src/state/README.md"] = "# state/\n\nImports nothing.\n";
    expect(() => folderRules(fixture(missing))).toThrow(/state\/README\.md: 0 "May import:" lines/);
    const tie = baseTree();
    tie["packages/server/src/state/README.md"] = "# state/\n\nMay import: `runs/api.ts`\n";
    expect(() => folderRules(fixture(tie))).toThrow(
      /tie folders in a circle \((runs → state → runs|state → runs → state)\)/,
    );
    const noReadme = baseTree();
    noReadme["packages/server/src/console/page.ts"] = "export const PAGE = 1;\n";
    expect(() => folderRules(fixture(noReadme))).toThrow(/console\/README\.md is missing/);
  });

  it("read every folder README of the repository", () => {
    const { folders } = folderRules(REPO_ROOT);
    const names = folders.map((f) => `${f.pkg}/${f.folder}`);
    expect(names).toEqual(
      expect.arrayContaining(["packages/server/app", "packages/server/console", "packages/runner/acp"]),
    );
  });
});
