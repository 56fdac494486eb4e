/**
 * The opt-in codex-acp smoke's own guard rails. The real adapter run is opt-in
 * (`WEBCODEX_SMOKE_CODEX_ACP=1 npm run smoke:codex`); here: the skip path, and
 * the adapter metadata check refusing something that is not codex-acp — both
 * without network or credentials.
 */
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { REPO_ROOT as ROOT } from "../test-support/index.js";

const SMOKE = join(ROOT, "scripts", "smoke-codex.mjs");

function smoke(env: Record<string, string>) {
  const base = { ...process.env };
  delete base.WEBCODEX_SMOKE_CODEX_ACP;
  delete base.WEBCODEX_SMOKE_CODEX_ACP_SCRIPT;
  delete base.WEBCODEX_SMOKE_CODEX_ACP_NODE;
  return promisify(execFile)(process.execPath, [SMOKE], { env: { ...base, ...env }, timeout: 30_000 }).then(
    (r) => ({ code: 0, stdout: r.stdout }),
    (err: { code: number; stdout: string }) => ({ code: err.code, stdout: err.stdout }),
  );
}

describe("npm run smoke:codex", () => {
  it("is skipped with a clear message and exit 0 unless WEBCODEX_SMOKE_CODEX_ACP=1", async () => {
    const result = await smoke({});
    expect(result.code).toBe(0);
    expect(result.stdout).toContain("smoke:codex skipped — set WEBCODEX_SMOKE_CODEX_ACP=1");
  });

  it("refuses an adapter whose package.json is not @agentclientprotocol/codex-acp", async () => {
    const dir = mkdtempSync(join(tmpdir(), "webcodex-smoke-meta-"));
    try {
      mkdirSync(join(dir, "dist"));
      writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "not-codex-acp", version: "2.6.0" }));
      writeFileSync(join(dir, "dist", "index.js"), "process.exit(1);\n");
      const result = await smoke({
        WEBCODEX_SMOKE_CODEX_ACP: "1",
        WEBCODEX_SMOKE_CODEX_ACP_SCRIPT: join(dir, "dist", "index.js"),
        WEBCODEX_SMOKE_CODEX_ACP_NODE: process.execPath,
      });
      expect(result.code).toBe(1);
      expect(result.stdout).toContain("names not-codex-acp, not @agentclientprotocol/codex-acp");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("needs the node binary when given an adapter script", async () => {
    const result = await smoke({ WEBCODEX_SMOKE_CODEX_ACP: "1", WEBCODEX_SMOKE_CODEX_ACP_SCRIPT: SMOKE });
    expect(result.code).toBe(1);
    expect(result.stdout).toContain("needs WEBCODEX_SMOKE_CODEX_ACP_NODE");
  });
});
