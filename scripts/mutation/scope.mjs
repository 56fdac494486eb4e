/**
 * What `npm run test:mutation` mutates: only the code that guards the promise
 * "never dispatch the same prompt twice, never show a run to the wrong
 * principal". Each entry names a module and, where only part of a file is in
 * scope, the declaration whose line range is mutated (found by name at run
 * time, so the scope follows edits to the file).
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";

/** @type {{ module: string; file: string; declaration?: string }[]} */
export const SCOPE = [
  { module: "run identity and fingerprints", file: "packages/server/src/runs/identity.ts" },
  { module: "authority / ownership", file: "packages/server/src/principals/authority.ts" },
  { module: "observation tokens", file: "packages/server/src/runs/observe-token.ts" },
  { module: "runner recovery", file: "packages/runner/src/store/recovery.ts" },
  {
    module: "dispatch-store phase logic",
    file: "packages/runner/src/store/dispatch-store.ts",
    declaration: "export class SqliteDispatchStore",
  },
  { module: "config sequencing", file: "packages/runner/src/acp/config-sequencing.ts" },
  {
    module: "env resolution",
    file: "packages/runner/src/process/spawn.ts",
    declaration: "export function resolveChildEnv",
  },
  { module: "redaction", file: "packages/runner/src/events/redactor.ts", declaration: "export class Redactor" },
];

/** 1-based inclusive line range of a top-level declaration: its first line to the next line that is exactly "}". */
export function declarationRange(root, file, declaration) {
  const lines = readFileSync(join(root, file), "utf8").split("\n");
  const start = lines.findIndex((line) => line.startsWith(declaration));
  if (start < 0) throw new Error(`mutation scope: ${file} has no line starting with "${declaration}"`);
  const end = lines.findIndex((line, i) => i > start && line === "}");
  if (end < 0) throw new Error(`mutation scope: ${file}: "${declaration}" has no closing "}" line`);
  return { start: start + 1, end: end + 1 };
}

/** Stryker `mutate` patterns for the scope (`file:start-end` for partial files). */
export function mutatePatterns(root) {
  return SCOPE.map(({ file, declaration }) => {
    if (!declaration) return file;
    const { start, end } = declarationRange(root, file, declaration);
    return `${file}:${start}-${end}`;
  });
}
