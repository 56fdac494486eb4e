/**
 * One Server process per state dir. The daemon holds an exclusive SQLite
 * lock on `server.lock` in its state dir for as long as it runs: SQLite
 * takes it with POSIX advisory locks, which the OS drops when the process
 * ends however it ends (kill -9 included), so a stale lock never blocks a
 * restart and there is no pid file to clean up. A second `webcodex-server
 * run` on the same state dir fails at once with StateDirLockedError.
 *
 * Only the daemon locks: the operator CLI (`token`, `runner-token`) opens
 * the state DB next to a running Server on purpose.
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";

export const STATE_LOCK_FILE = "server.lock";

export class StateDirLockedError extends Error {
  override readonly name = "StateDirLockedError";
}

export interface StateDirLock {
  readonly file: string;
  release(): void;
}

/** Take the state dir's lock (creating the dir, 0700, if needed) or throw StateDirLockedError. */
export function lockStateDir(stateDir: string): StateDirLock {
  mkdirSync(stateDir, { recursive: true, mode: 0o700 });
  const file = join(stateDir, STATE_LOCK_FILE);
  const db = new Database(file);
  try {
    db.pragma("busy_timeout = 0");
    db.pragma("locking_mode = EXCLUSIVE");
    // The first write under EXCLUSIVE locking mode takes the file's exclusive lock and keeps it until close.
    db.exec("CREATE TABLE IF NOT EXISTS held (pid INTEGER NOT NULL)");
    db.exec("BEGIN EXCLUSIVE");
    db.prepare("DELETE FROM held").run();
    db.prepare("INSERT INTO held (pid) VALUES (?)").run(process.pid);
    db.exec("COMMIT");
  } catch (err) {
    db.close();
    if ((err as { code?: string }).code === "SQLITE_BUSY") {
      throw new StateDirLockedError(
        `state dir ${stateDir} is in use by another webcodex-server (it holds ${file}); ` +
          "stop that Server first, or give this one its own [server] state_dir",
      );
    }
    throw err;
  }
  let held = true;
  return {
    file,
    release() {
      if (!held) return;
      held = false;
      db.close();
    },
  };
}
