/**
 * The link resume secret kept in the state dir (link/resume.ts): written 0600 and atomically, read back,
 * and never used when it is readable by others, another user's, a symlink or malformed (then removed).
 */
import {
  chmodSync,
  chownSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterAll, describe, expect, test } from "vitest";
import { RESUME_SECRET_FILE, removeResumeSecret, resumeSecretStore } from "../../src/link/resume.js";

const dir = mkdtempSync(join(tmpdir(), "wc-link-resume-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
/** A well-formed secret (43 base64url characters) that is long and random enough to be a canary. */
const SECRET = "kEpT_rEsUmE_sEcReT_cAnArY_7f3a9c1d2e4b6a8c0";

function store(lines: Record<string, unknown>[] = []) {
  return resumeSecretStore(dir, pino({ level: "debug" }, { write: (l: string) => lines.push(JSON.parse(l)) }));
}

describe("the kept link resume secret", () => {
  test("is written 0600 with no temp file left, read back by the next start, and never logged", () => {
    const lines: Record<string, unknown>[] = [];
    expect(store(lines).load()).toBeUndefined();
    store(lines).save(SECRET);
    expect(statSync(join(dir, RESUME_SECRET_FILE)).mode & 0o777).toBe(0o600);
    expect(readdirSync(dir)).toEqual([RESUME_SECRET_FILE]);
    expect(store(lines).load()).toBe(SECRET);
    expect(JSON.stringify(lines)).not.toContain(SECRET);
  });

  test("is not used, and is removed, when others can read it", () => {
    store().save(SECRET);
    chmodSync(join(dir, RESUME_SECRET_FILE), 0o644);
    const lines: Record<string, unknown>[] = [];
    expect(store(lines).load()).toBeUndefined();
    expect(existsSync(join(dir, RESUME_SECRET_FILE))).toBe(false);
    expect(lines.map((l) => l.msg)).toEqual([
      "the kept link resume secret is not a 0600 file of this Runner's user; not used",
    ]);
  });

  test("is not read through a symlink, nor from a file of another user", () => {
    const elsewhere = mkdtempSync(join(tmpdir(), "wc-link-resume-elsewhere-"));
    try {
      const planted = join(elsewhere, "planted");
      writeFileSync(planted, `${SECRET}\n`, { mode: 0o600 });
      symlinkSync(planted, join(dir, RESUME_SECRET_FILE));
      expect(store().load()).toBeUndefined();
      rmSync(join(dir, RESUME_SECRET_FILE));
      if (process.getuid?.() === 0) {
        // As root: a 0600 file that belongs to someone else is not this Runner's.
        store().save(SECRET);
        chownSync(join(dir, RESUME_SECRET_FILE), 65534, 65534);
        expect(store().load()).toBeUndefined();
        expect(existsSync(join(dir, RESUME_SECRET_FILE))).toBe(false);
      }
    } finally {
      rmSync(elsewhere, { recursive: true, force: true });
    }
  });

  test("is not used, and is removed, when malformed; removeResumeSecret clears it", () => {
    writeFileSync(join(dir, RESUME_SECRET_FILE), "not a secret\n", { mode: 0o600 });
    expect(store().load()).toBeUndefined();
    expect(existsSync(join(dir, RESUME_SECRET_FILE))).toBe(false);
    store().save(SECRET);
    removeResumeSecret(dir);
    expect(readdirSync(dir)).toEqual([]);
  });
});
