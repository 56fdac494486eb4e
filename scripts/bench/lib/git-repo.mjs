/**
 * Generated git repositories for the workspace bench: `files` small text files in directories of
 * FILES_PER_DIR (`src/m000/f00000.js`, …), committed once on `main`. Bounded in size and in git's time.
 */
import { execFile } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

/** Most files one generated repository holds (the bench's largest is 10,000). */
export const MAX_GENERATED_FILES = 20_000;
/** Files per directory of a generated repository. */
const FILES_PER_DIR = 100;
/** Longest one git command of the generator or the bench's own diff may take. */
export const GIT_TIMEOUT_MS = 120_000;
/** Most bytes of output the bench reads from one git command (a 1,000-file diff is ~100 KB). */
export const GIT_MAX_OUTPUT_BYTES = 64 * 1024 * 1024;

/** The identity of the generated commit (no global git config needed). */
const IDENTITY = ["-c", "user.name=webcodex-bench", "-c", "user.email=bench@localhost", "-c", "commit.gpgsign=false"];

/** `git -C dir …args` → stdout; throws on a non-zero exit or past GIT_TIMEOUT_MS. */
export async function git(dir, args) {
  const { stdout } = await run("git", ["-C", dir, ...IDENTITY, ...args], {
    timeout: GIT_TIMEOUT_MS,
    maxBuffer: GIT_MAX_OUTPUT_BYTES,
  });
  return stdout;
}

/**
 * Writes `files` files into `dir` (made), `git init` + one commit of them all. Returns the ms it took and the
 * commit, so the report can say what the repository cost to make.
 */
export async function generateRepo(dir, files) {
  if (!Number.isInteger(files) || files < 1 || files > MAX_GENERATED_FILES) {
    throw new Error(`generateRepo: files must be an integer in 1 … ${MAX_GENERATED_FILES}, got ${files}`);
  }
  const t0 = performance.now();
  mkdirSync(dir, { recursive: true });
  for (let d = 0; d * FILES_PER_DIR < files; d++) {
    const sub = join(dir, "src", `m${String(d).padStart(3, "0")}`);
    mkdirSync(sub, { recursive: true });
    for (let i = d * FILES_PER_DIR; i < Math.min(files, (d + 1) * FILES_PER_DIR); i++) {
      writeFileSync(
        join(sub, `f${String(i).padStart(5, "0")}.js`),
        `// generated file ${i}\nexport const value${i} = ${i};\nexport function f${i}(x) {\n  return x + ${i};\n}\n`,
      );
    }
  }
  writeFileSync(join(dir, "README.md"), `generated repository of ${files} files\n`);
  await git(dir, ["init", "-q", "-b", "main"]);
  await git(dir, ["add", "-A"]);
  await git(dir, ["commit", "-q", "-m", `generated ${files} files`]);
  const commit = (await git(dir, ["rev-parse", "HEAD"])).trim();
  return { files, commit, ms: performance.now() - t0 };
}
