/**
 * The per-folder import rules of the Server and the Runner, read from each folder's README.md, so that the
 * README and the check cannot drift (issue 40). `.dependency-cruiser.mjs` turns them into rules; `npm run lint`
 * runs them. `node scripts/lint/folder-rules.mjs` prints what it read.
 *
 * Every folder directly under `packages/server/src/` and `packages/runner/src/` has a README.md with exactly one
 * line of the form
 *
 *     May import: `state/`, `principals/principal.ts`, `config.ts`
 *
 * — backticked paths relative to the package's `src/`, separated by ", ": a trailing `/` names a whole folder,
 * anything else one file; `nothing` alone means no module of the package outside the folder. The folder's own
 * files, the protocol package and npm packages are not listed (the package rules of `.dependency-cruiser.mjs` decide
 * those). An import the line does not allow fails the lint, unless the README lists it under
 *
 *     Known exceptions (to be removed):
 *     - `runs/tools.ts` → `mcp/tool-shared.ts`: one line why.
 *
 * as one file importing one file. An exception that no longer exists fails the lint as well (a `required`
 * rule), so a fixed tie leaves the README with its fix. The "May import" lines themselves must be acyclic
 * between folders: a two-way tie between folders is only ever an exception.
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";

/** The packages whose folders carry "May import" rules. */
export const RULED_PACKAGES = ["packages/server", "packages/runner"];

const MAY_IMPORT = /^May import: (.*)$/;
const EXCEPTIONS_HEADING = "Known exceptions (to be removed):";
const EXCEPTION_LINE = /^- `([^`]+)` → `([^`]+)`: (.+)$/;
const ENTRY = /^`([^`]+)`$/;

export class FolderRulesError extends Error {
  name = "FolderRulesError";
}

const escapeRegex = (text) => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

/** One entry of a "May import" line as a path regex (anchored at the repository root). */
function entryPattern(src, entry) {
  return entry.endsWith("/") ? `^${escapeRegex(`${src}/${entry}`)}` : `^${escapeRegex(`${src}/${entry}`)}$`;
}

/** The rules of one folder, from its README. Throws FolderRulesError naming the README and what is wrong. */
export function readFolder(root, pkg, folder) {
  const src = `${pkg}/src`;
  const readme = `${src}/${folder}/README.md`;
  if (!existsSync(join(root, readme))) {
    throw new FolderRulesError(`${readme} is missing: every folder of ${src} has a README with a "May import:" line`);
  }
  const lines = readFileSync(join(root, readme), "utf8").split("\n");
  const mayLines = lines.filter((line) => MAY_IMPORT.test(line));
  if (mayLines.length !== 1) {
    throw new FolderRulesError(`${readme}: ${mayLines.length} "May import:" lines; exactly one is allowed`);
  }
  const list = MAY_IMPORT.exec(mayLines[0])[1].replace(/\.$/, "");
  const mayImport = [];
  if (list !== "nothing") {
    for (const item of list.split(", ")) {
      const entry = ENTRY.exec(item)?.[1];
      if (entry === undefined) {
        throw new FolderRulesError(`${readme}: "May import:" entry ${JSON.stringify(item)} is not one backticked path`);
      }
      checkPath(root, src, readme, entry);
      if (entry === `${folder}/` || entry.startsWith(`${folder}/`)) {
        throw new FolderRulesError(`${readme}: "May import:" names the folder's own ${entry}`);
      }
      mayImport.push(entry);
    }
  }
  const exceptions = [];
  const heading = lines.indexOf(EXCEPTIONS_HEADING);
  if (heading >= 0) {
    let rest = lines.slice(heading + 1);
    while (rest.length > 0 && rest[0].trim() === "") rest = rest.slice(1);
    const end = rest.findIndex((line) => !line.startsWith("- "));
    const items = end === -1 ? rest : rest.slice(0, end);
    if (items.length === 0) throw new FolderRulesError(`${readme}: "${EXCEPTIONS_HEADING}" lists nothing`);
    for (const line of items) {
      const m = EXCEPTION_LINE.exec(line);
      if (m === null) {
        throw new FolderRulesError(
          `${readme}: exception line ${JSON.stringify(line)} is not "- \`from\` → \`to\`: why"`,
        );
      }
      const [, from, to, why] = m;
      if (!from.startsWith(`${folder}/`)) {
        throw new FolderRulesError(`${readme}: exception ${from} → ${to} is not from a file of ${folder}/`);
      }
      checkPath(root, src, readme, from);
      checkPath(root, src, readme, to);
      exceptions.push({ from, to, why });
    }
  }
  return { pkg, folder, readme, mayImport, exceptions };
}

function checkPath(root, src, readme, entry) {
  const path = join(root, src, entry);
  const ok = entry.endsWith("/") ? existsSync(path) && statSync(path).isDirectory() : existsSync(path);
  if (!ok) throw new FolderRulesError(`${readme}: ${entry} does not exist under ${src}/`);
}

/** The folders directly under a package's src/. */
export function foldersOf(root, pkg) {
  return readdirSync(join(root, pkg, "src"), { withFileTypes: true })
    .filter((d) => d.isDirectory())
    .map((d) => d.name)
    .sort();
}

/** Every ruled folder's rules. */
export function readAllFolders(root) {
  return RULED_PACKAGES.flatMap((pkg) => foldersOf(root, pkg).map((folder) => readFolder(root, pkg, folder)));
}

/** The folder an allowed entry points into, or null for a file at the top of src/. */
const folderOf = (entry) => (entry.includes("/") ? entry.slice(0, entry.indexOf("/")) : null);

/** A cycle between folders through "May import" lines (exceptions excluded), or null. */
export function findAllowedCycle(folders) {
  for (const pkg of RULED_PACKAGES) {
    const mine = folders.filter((f) => f.pkg === pkg);
    const edges = new Map(
      mine.map((f) => [f.folder, [...new Set(f.mayImport.map(folderOf).filter((x) => x !== null))]]),
    );
    const state = new Map();
    const stack = [];
    const visit = (node) => {
      state.set(node, "open");
      stack.push(node);
      for (const next of edges.get(node) ?? []) {
        if (state.get(next) === "open") return [...stack.slice(stack.indexOf(next)), next];
        if (!state.has(next)) {
          const found = visit(next);
          if (found) return found;
        }
      }
      stack.pop();
      state.set(node, "done");
      return null;
    };
    for (const node of edges.keys()) {
      if (!state.has(node)) {
        const found = visit(node);
        if (found) return { pkg, cycle: found };
      }
    }
  }
  return null;
}

/** The dependency-cruiser rules: `forbidden` (what each folder may not import) and `required` (live exceptions). */
export function folderRules(root) {
  const folders = readAllFolders(root);
  const cycle = findAllowedCycle(folders);
  if (cycle !== null) {
    throw new FolderRulesError(
      `${cycle.pkg}: the "May import:" lines tie folders in a circle (${cycle.cycle.join(" → ")}); ` +
        "one of those arrows must be a known exception in its folder's README",
    );
  }
  const forbidden = [];
  const required = [];
  for (const { pkg, folder, readme, mayImport, exceptions } of folders) {
    const src = `${pkg}/src`;
    const own = `^${escapeRegex(`${src}/${folder}/`)}`;
    const allowed = [own, ...mayImport.map((entry) => entryPattern(src, entry))];
    const bySource = new Map();
    for (const e of exceptions) bySource.set(e.from, [...(bySource.get(e.from) ?? []), e]);
    forbidden.push({
      name: `folder:${pkg.slice("packages/".length)}/${folder}`,
      comment: `${readme}: "May import: ${mayImport.join(", ") || "nothing"}"`,
      severity: "error",
      from: { path: own, pathNot: [...bySource.keys()].map((from) => entryPattern(src, from)) },
      to: { path: `^${escapeRegex(`${src}/`)}`, pathNot: allowed },
    });
    for (const [from, list] of bySource) {
      forbidden.push({
        name: `folder:${pkg.slice("packages/".length)}/${from} (known exception)`,
        comment: `${readme}, known exceptions: ${list.map((e) => `${e.to} (${e.why})`).join("; ")}`,
        severity: "error",
        from: { path: entryPattern(src, from) },
        to: { path: `^${escapeRegex(`${src}/`)}`, pathNot: [...allowed, ...list.map((e) => entryPattern(src, e.to))] },
      });
      for (const e of list) {
        required.push({
          name: `exception-still-needed:${pkg.slice("packages/".length)}/${from}->${e.to}`,
          comment: `${readme} lists ${from} → ${e.to} as a known exception; once the import is gone, remove the line`,
          severity: "error",
          module: { path: entryPattern(src, from) },
          to: { path: entryPattern(src, e.to) },
        });
      }
    }
  }
  return { forbidden, required, folders };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const root = relative(process.cwd(), fileURLToPath(new URL("../..", import.meta.url))) || ".";
  for (const f of readAllFolders(root)) {
    process.stdout.write(`${f.pkg}/src/${f.folder}/: ${f.mayImport.join(", ") || "nothing"}\n`);
    for (const e of f.exceptions) process.stdout.write(`    exception ${e.from} → ${e.to}: ${e.why}\n`);
  }
  const { forbidden, required } = folderRules(root);
  process.stdout.write(`${forbidden.length} forbidden rules, ${required.length} required rules\n`);
}
