/**
 * Who may import what (issue 40, design §2), checked by `npm run lint`:
 *   npx depcruise --config .dependency-cruiser.mjs packages/protocol/src packages/runner/src packages/server/src
 *     packages/cli/src fake-acp-agent/src
 * The package rules are here; the per-folder rules of the Server and the Runner come from each folder's README
 * (scripts/lint/folder-rules.mjs), so the README and the check cannot drift.
 */
import { fileURLToPath } from "node:url";
import { folderRules } from "./scripts/lint/folder-rules.mjs";

/** Our workspace packages, as paths from the repository root (a workspace import resolves to its dist/). */
const PACKAGE = {
  protocol: "^packages/protocol/",
  runner: "^packages/runner/",
  server: "^packages/server/",
  cli: "^packages/cli/",
  fake: "^fake-acp-agent/",
};
const ANY_PACKAGE = "^(packages/[^/]+|fake-acp-agent)/";

/** The rule set for the repository at `root` (scripts/test/import-rules.test.ts runs it on a fixture tree). */
export function configFor(root) {
  const folders = folderRules(root);
  return {
    forbidden: [
      {
        name: "no-circular",
        comment: "No module reaches itself through its imports (type-only imports count too).",
        severity: "error",
        from: {},
        to: { circular: true },
      },
      {
        name: "not-to-unresolvable",
        comment:
          "Every import resolves, through a dependency's `exports` only: a path into a package's unexported files " +
          "(`@x/y/dist/...`, `@webcodex/protocol/src/...`) does not resolve and fails here.",
        severity: "error",
        from: {},
        to: { couldNotResolve: true },
      },
      {
        name: "protocol-imports-no-package",
        comment: "packages/protocol is the bottom: it imports no other workspace package.",
        severity: "error",
        from: { path: PACKAGE.protocol },
        to: { path: ANY_PACKAGE, pathNot: PACKAGE.protocol },
      },
      {
        name: "protocol-no-io",
        comment: "packages/protocol is types, schemas and bounds: no Node built-in module (no I/O).",
        severity: "error",
        from: { path: PACKAGE.protocol },
        to: { dependencyTypes: ["core"] },
      },
      {
        name: "runner-not-server",
        comment: "The Runner and the Server share only the protocol package.",
        severity: "error",
        from: { path: PACKAGE.runner },
        to: { path: ANY_PACKAGE, pathNot: [PACKAGE.runner, PACKAGE.protocol] },
      },
      {
        name: "server-not-runner",
        comment: "The Server and the Runner share only the protocol package.",
        severity: "error",
        from: { path: PACKAGE.server },
        to: { path: ANY_PACKAGE, pathNot: [PACKAGE.server, PACKAGE.protocol] },
      },
      {
        name: "cli-mcp-only",
        comment: "The CLI talks MCP: it imports the protocol package for the shared wire shapes, never the daemons.",
        severity: "error",
        from: { path: PACKAGE.cli },
        to: { path: ANY_PACKAGE, pathNot: [PACKAGE.cli, PACKAGE.protocol] },
      },
      {
        name: "fake-agent-imports-none-of-ours",
        comment: "The fake ACP agent is an ACP agent like any other: none of our packages.",
        severity: "error",
        from: { path: PACKAGE.fake },
        to: { path: ANY_PACKAGE, pathNot: PACKAGE.fake },
      },
      {
        name: "no-relative-path-into-another-package",
        comment:
          "A package reaches another only through its name and public exports, never by a relative path into its " +
          "src/ or dist/.",
        severity: "error",
        from: { path: "^(packages/[^/]+|fake-acp-agent)/" },
        to: { dependencyTypes: ["local"], path: ANY_PACKAGE, pathNot: "^$1/" },
      },
      ...folders.forbidden,
    ],
    required: folders.required,
    options: {
      // Not "exclude": an import resolving into a package's dist/ (a workspace package by name) stays in the
      // graph for the package rules, and an unresolvable `x/dist/...` path stays for not-to-unresolvable.
      doNotFollow: { path: ["node_modules", "^(packages/[^/]+|fake-acp-agent)/dist/", "^packages/runner/generated/"] },
      tsPreCompilationDeps: true,
      tsConfig: { fileName: "tsconfig.json" },
      enhancedResolveOptions: {
        exportsFields: ["exports"],
        conditionNames: ["import", "require", "node", "default", "types"],
        mainFields: ["module", "main", "types", "typings"],
      },
      skipAnalysisNotInRules: true,
    },
  };
}

export default configFor(fileURLToPath(new URL(".", import.meta.url)));
