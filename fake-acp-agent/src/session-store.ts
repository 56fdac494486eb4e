import { randomUUID } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";

/** A session id this store accepts as a file name (ours are `fake-session-<uuid>`). */
const SESSION_ID = /^[A-Za-z0-9_-]{1,128}$/;
/** Prompts kept per session: the oldest are dropped past this (a chain of turns stays small in tests). */
export const MAX_STORED_PROMPTS = 256;

const Stored = z.object({ cwd: z.string(), prompts: z.array(z.string()) }).strict();
export type StoredSession = z.infer<typeof Stored>;

/**
 * Sessions persisted under `--session-dir` (one `<sessionId>.json` per session: its cwd and the prompt
 * texts it saw, in order), so a later agent process can `session/load` or `session/resume` them.
 */
export class SessionStore {
  constructor(readonly dir: string) {
    mkdirSync(dir, { recursive: true });
  }

  /** A fresh id no other agent process sharing the dir will pick. */
  static newId(): string {
    return `fake-session-${randomUUID()}`;
  }

  #path(sessionId: string): string | null {
    return SESSION_ID.test(sessionId) ? join(this.dir, `${sessionId}.json`) : null;
  }

  /** The stored session, or null when there is none under that id (or the id is not one we could store). */
  read(sessionId: string): StoredSession | null {
    const path = this.#path(sessionId);
    if (path === null || !existsSync(path)) return null;
    const parsed = Stored.safeParse(JSON.parse(readFileSync(path, "utf8")));
    return parsed.success ? parsed.data : null;
  }

  write(sessionId: string, session: StoredSession): void {
    const path = this.#path(sessionId);
    if (path === null) throw new Error(`session id ${JSON.stringify(sessionId)} cannot be stored`);
    const kept = { cwd: session.cwd, prompts: session.prompts.slice(-MAX_STORED_PROMPTS) };
    const tmp = `${path}.${process.pid}.tmp`;
    writeFileSync(tmp, `${JSON.stringify(kept)}\n`);
    renameSync(tmp, path);
  }
}
