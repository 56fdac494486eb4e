/**
 * Small state files that must be whole after a crash: written to a temp file (0600), fsync'd, renamed over
 * the old one, and the directory fsync'd, so a reader finds the old content or the new, never a mix.
 */
import { closeSync, fsyncSync, openSync, renameSync, rmSync, writeSync } from "node:fs";
import { dirname } from "node:path";

export function writeFileDurably(file: string, text: string): void {
  const tmp = `${file}.tmp`;
  rmSync(tmp, { force: true });
  const fd = openSync(tmp, "wx", 0o600);
  try {
    writeSync(fd, text);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, file);
  const dir = openSync(dirname(file), "r");
  try {
    fsyncSync(dir);
  } finally {
    closeSync(dir);
  }
}
