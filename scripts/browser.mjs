/**
 * The headless browser every browser test and script launches: the Chromium
 * build that the `@sparticuz/chromium` devDependency ships inside its npm
 * tarball, driven by playwright-core. Nothing is installed on the machine and
 * nothing is downloaded at test time, so `npm install && npm test` needs only
 * Node. Plain JavaScript so that the Node scripts (the conformance run's
 * consent step) share it with the TypeScript tests
 * (packages/server/test/support/browser.ts).
 *
 * The package inflates its brotli-packed binary into `os.tmpdir()` on first
 * use and then trusts whatever file is there. Two test files inflating at once
 * could launch a half-written binary, and a copy left by another version (or
 * another user) would be launched in its place. So the inflation runs in a
 * child whose TMPDIR is a fresh staging directory beside the cache, which is
 * then renamed into place as a whole: a directory per package version under
 * `node_modules/.cache/`. A rename that loses the race keeps the winner's copy.
 */
import { execFile } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, rename, rm, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import Chromium from "@sparticuz/chromium";

/** Upper bound on inflating the packed browser (about 200 MB; ~1 s on a quiet machine). */
const INFLATE_TIMEOUT_MS = 120_000;

/**
 * Flags from the package's (Lambda-oriented) list that the tests leave out:
 * two switch off the web's security model, and the consent page is a security
 * surface the tests must see as a normal browser does (same-origin policy,
 * mixed content); `--single-process` makes the browser exit when a test closes
 * its first context, and is only needed where Lambda forbids no_new_privs.
 */
const DROPPED_FLAGS = new Set(["--disable-web-security", "--allow-running-insecure-content", "--single-process"]);

/** The package's CommonJS entry (build/cjs/index.cjs); its package.json is two folders up (not exported). */
const ENTRY = createRequire(import.meta.url).resolve("@sparticuz/chromium");
const pkgVersion = JSON.parse(readFileSync(join(dirname(ENTRY), "..", "..", "package.json"), "utf8")).version;
const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const CACHE_PARENT = join(REPO_ROOT, "node_modules", ".cache");
const CACHE_DIR = join(CACHE_PARENT, `webcodex-chromium-${pkgVersion}`);
/** Written by us: the system's fonts plus the package's, so text renders on a machine with no fonts installed. */
const FONTS_CONF = "webcodex-fonts.conf";

async function inflateOnce() {
  if (existsSync(join(CACHE_DIR, "chromium"))) return; // only ever created whole, by the rename below
  await mkdir(CACHE_PARENT, { recursive: true });
  const staging = await mkdtemp(join(CACHE_PARENT, "webcodex-chromium-staging-"));
  try {
    await promisify(execFile)(
      process.execPath,
      ["-e", `require(${JSON.stringify(ENTRY)}).executablePath().then(() => {})`],
      { env: { ...process.env, TMPDIR: staging }, timeout: INFLATE_TIMEOUT_MS },
    );
    await writeFile(
      join(staging, FONTS_CONF),
      `<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig>\n` +
        `  <include ignore_missing="yes">/etc/fonts/fonts.conf</include>\n` +
        `  <dir prefix="relative">fonts/fonts</dir>\n</fontconfig>\n`,
    );
    await rename(staging, CACHE_DIR).catch((err) => {
      // Another test file finished first: its copy is complete, keep it.
      if (!(err.code === "ENOTEMPTY" || err.code === "EEXIST")) throw err;
    });
  } finally {
    await rm(staging, { recursive: true, force: true });
  }
}

/**
 * Options for `chromium.launch()` from playwright-core: the packaged browser, headless, its flags.
 * @returns {Promise<import("playwright-core").LaunchOptions>}
 */
export async function browserLaunchOptions() {
  await inflateOnce();
  return {
    executablePath: join(CACHE_DIR, "chromium"),
    headless: true,
    args: Chromium.args.filter((a) => !DROPPED_FLAGS.has(a)),
    env: { ...process.env, FONTCONFIG_FILE: join(CACHE_DIR, FONTS_CONF) },
  };
}
