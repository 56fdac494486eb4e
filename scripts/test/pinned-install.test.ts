/** The shared pinned installer (scripts/pinned-install.mjs) over a stand-in `npm` on PATH. */
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
// @ts-expect-error plain .mjs scripts without type declarations
import { approveAndRebuild, installedVersion, installPinned, MAX_NPM_WHY_CHARS } from "../pinned-install.mjs";

/** Logs each call's cwd and argv; installs `name@version` specs as bare package.json files; `bad@…` fails. */
const FAKE_NPM = `#!/bin/sh
printf '%s|%s\\n' "$PWD" "$*" >> "$FAKE_NPM_LOG"
[ "$1" = install ] || exit 0
for spec in "$@"; do
  case "$spec" in
    --*|install) ;;
    bad@*) echo "npm error 404 first line" >&2; echo "npm error second line $(printf 'x%.0s' $(seq 1 400))" >&2; exit 1 ;;
    *@*) name="\${spec%@*}"; mkdir -p "node_modules/$name"
         printf '{"name":"%s","version":"%s"}' "$name" "\${spec##*@}" > "node_modules/$name/package.json" ;;
  esac
done
`;

describe("pinned installer", () => {
  const root = mkdtempSync(join(tmpdir(), "wc-pinned-"));
  const log = join(root, "npm.log");
  const saved = { PATH: process.env.PATH, FAKE_NPM_LOG: process.env.FAKE_NPM_LOG };
  beforeAll(() => {
    writeFileSync(join(root, "npm"), FAKE_NPM);
    chmodSync(join(root, "npm"), 0o755);
    process.env.PATH = `${root}${delimiter}${saved.PATH}`;
    process.env.FAKE_NPM_LOG = log;
  });
  afterAll(() => {
    process.env.PATH = saved.PATH;
    if (saved.FAKE_NPM_LOG === undefined) delete process.env.FAKE_NPM_LOG;
    else process.env.FAKE_NPM_LOG = saved.FAKE_NPM_LOG;
    rmSync(root, { recursive: true, force: true });
  });
  const calls = () => readFileSync(log, "utf8").trim().split("\n");

  it("installs exact pins into the cache folder, approving only the named install scripts", () => {
    const dir = join(root, "cache-a");
    expect(installPinned(dir, ["a@1.2.3", "@scope/b@4.5.6"], { approveScripts: ["node"] })).toMatchObject({
      ok: true,
    });
    expect(JSON.parse(readFileSync(join(dir, "package.json"), "utf8"))).toEqual({
      private: true,
      allowScripts: { node: true },
    });
    expect(calls().at(-1)).toBe(
      `${dir}|install --prefix ${dir} --save-exact --no-audit --no-fund --loglevel=error a@1.2.3 @scope/b@4.5.6`,
    );
    expect(installedVersion(dir, "a")).toBe("1.2.3");
    expect(installedVersion(dir, "@scope/b")).toBe("4.5.6");
    expect(installedVersion(dir, "missing")).toBeNull();
  });

  it("writes no package.json of its own when no install script is approved", () => {
    const dir = join(root, "cache-b");
    expect(installPinned(dir, ["a@1.0.0"]).ok).toBe(true);
    expect(existsSync(join(dir, "package.json"))).toBe(false);
  });

  it("ignoreScripts: no install script runs at all (--ignore-scripts)", () => {
    const dir = join(root, "cache-d");
    expect(installPinned(dir, ["a@2.0.0"], { ignoreScripts: true }).ok).toBe(true);
    expect(calls().at(-1)).toBe(
      `${dir}|install --prefix ${dir} --save-exact --no-audit --no-fund --loglevel=error --ignore-scripts a@2.0.0`,
    );
  });

  it("never throws on a failed step: it answers npm's last two lines, bounded", () => {
    const r = installPinned(join(root, "cache-c"), ["bad@1.0.0"]);
    expect(r).toMatchObject({ ok: false, status: 1 });
    expect(r.why).toMatch(/^npm error 404 first line npm error second line x+$/);
    expect(r.why.length).toBe(MAX_NPM_WHY_CHARS);
  });

  it("approves a package's install script, then rebuilds it", () => {
    const dir = join(root, "cache-a");
    expect(approveAndRebuild(dir, "node").ok).toBe(true);
    expect(calls().slice(-2)).toEqual([`${dir}|install-scripts approve node`, `${dir}|rebuild node`]);
  });
});
