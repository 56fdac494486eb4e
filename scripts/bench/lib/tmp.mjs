/** Temp state dirs of one bench run; removed at the end unless --keep. */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { killByMarker } from "./proc.mjs";

const dirs = [];

export function makeTempDir(label) {
  const dir = mkdtempSync(join(tmpdir(), `webcodex-bench-${label}-`));
  dirs.push(dir);
  return dir;
}

/** Kills any process still running from one of our temp dirs (by pid), then removes the dirs. */
export function removeTempDirs({ keep = false } = {}) {
  for (const dir of dirs.splice(0)) {
    killByMarker(dir);
    if (keep) continue;
    try {
      rmSync(dir, { recursive: true, force: true });
    } catch {
      // best effort
    }
  }
}
