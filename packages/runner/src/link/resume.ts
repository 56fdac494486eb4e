/**
 * The link's resume secret kept in the Runner's state dir (packages/runner/README.md, "Server link"), so a
 * Runner restarting after its own crash presents it in its first hello and takes its link back at once,
 * instead of waiting until the Server declares the dead process's link dead.
 *
 * Kept only when no agent runs as the Runner's user (config/exposure.ts `sameUserAgents`): the file is 0600 in
 * the 0700 state dir, so an agent under another user cannot read it, and the Server stores only its
 * sha256. Whoever can read it can already read the Runner's token. With a same-user agent nothing is
 * written, and a copy left by an earlier configuration is removed at start.
 *
 * Written atomically (temp file, fsync, rename); a file that is not 0600, or does not hold a well-formed
 * secret, is ignored and removed. The secret itself is never logged.
 */
import { closeSync, constants, fstatSync, openSync, readSync, rmSync } from "node:fs";
import { join } from "node:path";
import { ResumeSecret } from "@webcodex/protocol";
import { writeFileDurably } from "../durable-file.js";
import type { Logger } from "../logger.js";

/** Its name in the state dir. */
export const RESUME_SECRET_FILE = "link-resume-secret";
/** Most bytes of the file read (a secret is 43, plus a newline; anything longer is malformed anyway). */
const MAX_RESUME_FILE_BYTES = 128;

export interface ResumeSecretStore {
  /** The secret the last run of this Runner got in `hello.ack`, or undefined. */
  load(): string | undefined;
  /** Keep `secret` for the next start; a failure is logged (the next start then waits instead). */
  save(secret: string): void;
}

/** The store in `stateDir` (which exists: the dispatch store created it 0700). */
export function resumeSecretStore(stateDir: string, logger: Logger): ResumeSecretStore {
  const file = join(stateDir, RESUME_SECRET_FILE);
  return {
    load() {
      let text: string;
      let fd: number;
      try {
        // Not through a symlink, and the checks on the very file read (fstat), not on whatever the name
        // points to by then.
        fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW);
      } catch {
        return undefined; // none kept (first start, or a clean stop of a shared-user Runner), or a symlink
      }
      try {
        const st = fstatSync(fd);
        const uid = process.getuid?.();
        if (!st.isFile() || (st.mode & 0o077) !== 0 || (uid !== undefined && st.uid !== uid)) {
          logger.warn(
            { file: RESUME_SECRET_FILE },
            "the kept link resume secret is not a 0600 file of this Runner's user; not used",
          );
          removeResumeSecret(stateDir);
          return undefined;
        }
        const buf = Buffer.alloc(MAX_RESUME_FILE_BYTES);
        text = buf.toString("utf8", 0, readSync(fd, buf, 0, buf.byteLength, 0));
      } catch {
        return undefined;
      } finally {
        closeSync(fd);
      }
      const parsed = ResumeSecret.safeParse(text.trim());
      if (parsed.success) return parsed.data;
      logger.warn({ file: RESUME_SECRET_FILE }, "the kept link resume secret is malformed; not used");
      removeResumeSecret(stateDir);
      return undefined;
    },
    save(secret) {
      try {
        writeFileDurably(file, `${secret}\n`);
      } catch (error) {
        logger.warn(
          { err_code: (error as NodeJS.ErrnoException).code ?? "unknown" },
          "could not keep the link resume secret in the state dir; after a crash this Runner waits for its old link to be declared dead",
        );
      }
    },
  };
}

/** Remove a kept secret (and a half-written one), if any. */
export function removeResumeSecret(stateDir: string): void {
  const file = join(stateDir, RESUME_SECRET_FILE);
  rmSync(file, { force: true });
  rmSync(`${file}.tmp`, { force: true });
}
