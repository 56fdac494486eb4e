/** Temp state dirs of one bench run; removed at the end unless --keep. */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const dirs = [];

export function makeTempDir(label) {
  const dir = mkdtempSync(join(tmpdir(), `webcodex-bench-${label}-`));
  dirs.push(dir);
  return dir;
}

export function removeTempDirs() {
  for (const dir of dirs.splice(0)) {
    try {
      rmSync(dir, { recursive: true, force: true });
    } catch {
      // best effort
    }
  }
}
