/**
 * Sizes of the hardening suite: `npm run test:hardening` sets WEBCODEX_HARDENING=full
 * (scripts/hardening/vitest.config.ts); `npm test` runs the short variant.
 */
export const FULL = process.env.WEBCODEX_HARDENING === "full";

/** `full` in the full suite, `short` inside `npm test`. */
export function size(full: number, short: number): number {
  return FULL ? full : short;
}

/**
 * The fast-check seed of a run: WEBCODEX_HARDENING_SEED to reproduce one, else a fresh one.
 * Every test prints the seed it used.
 */
export function seed(): number {
  const given = process.env.WEBCODEX_HARDENING_SEED;
  if (given !== undefined && given !== "") {
    const n = Number(given);
    if (!Number.isSafeInteger(n)) throw new Error(`WEBCODEX_HARDENING_SEED must be an integer, got ${given}`);
    return n;
  }
  return Math.floor(Math.random() * 2 ** 31);
}

/** Resident set size of a process in bytes (Linux /proc), or undefined when it is gone. */
export async function rssBytes(pid: number): Promise<number | undefined> {
  const { readFile } = await import("node:fs/promises");
  try {
    const status = await readFile(`/proc/${pid}/status`, "utf8");
    const kb = /^VmRSS:\s+(\d+) kB$/m.exec(status)?.[1];
    return kb === undefined ? undefined : Number(kb) * 1024;
  } catch {
    return undefined;
  }
}

/** Open file descriptors of a process (Linux /proc), or undefined when it is gone. */
export async function fdCount(pid: number | "self"): Promise<number | undefined> {
  const { readdir } = await import("node:fs/promises");
  try {
    return (await readdir(`/proc/${pid}/fd`)).length;
  } catch {
    return undefined;
  }
}
