/**
 * The server secret derives every run id and signs every observation token: a
 * corrupt one must stop the real `webcodex-server run` at start, and the file
 * must be left exactly as it was (never replaced, which would silently change
 * every run id and invalidate every token).
 */
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { SERVER_BIN } from "../../../scripts/test-support/index.js";
import { sha256Hex } from "../src/config.js";

/** Upper bound on one refused start (it exits before listening). */
const START_TIMEOUT_MS = 20_000;

let dir: string | undefined;
afterEach(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
  dir = undefined;
});

function serverDir(secret: string | null): { config: string; secretFile: string } {
  dir = mkdtempSync(join(tmpdir(), "wc-secret-"));
  const state = join(dir, "state");
  mkdirSync(state);
  const secretFile = join(state, "server_secret");
  if (secret !== null) writeFileSync(secretFile, secret, { mode: 0o600 });
  const config = join(dir, "server.toml");
  writeFileSync(
    config,
    `[server]\nhost = "127.0.0.1"\nport = 0\nstate_dir = "state"\n\n` +
      `[[runners]]\nid = "r1"\ntoken_sha256 = "${sha256Hex("runner-token")}"\nprojects = ["demo"]\n`,
  );
  return { config, secretFile };
}

function run(config: string) {
  return spawnSync(process.execPath, [SERVER_BIN, "run", "--config", config], {
    encoding: "utf8",
    timeout: START_TIMEOUT_MS,
  });
}

describe("a corrupt server_secret", () => {
  it.each([
    ["not hex", `${"zz".repeat(32)}\n`],
    ["too short", `${"ab".repeat(16)}\n`],
    ["empty", ""],
    ["uppercase hex", `${"AB".repeat(32)}\n`],
  ])("(%s) is refused at start and left untouched", (_label, secret) => {
    const { config, secretFile } = serverDir(secret);
    const result = run(config);
    expect(result.status).toBe(1);
    expect(result.stderr).toContain("server secret is corrupt; refusing to replace it");
    expect(result.stdout).not.toContain('"listening"');
    expect(readFileSync(secretFile, "utf8")).toBe(secret);
  });
});
