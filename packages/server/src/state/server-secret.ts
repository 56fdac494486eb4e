/**
 * The Server's own secret (observation tokens, tenant tags): 32 random bytes in `<state_dir>/server_secret`,
 * 0600, made once and never replaced — a corrupt file is refused, not overwritten.
 */
import { randomBytes } from "node:crypto";
import { chmodSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const SECRET_FILE = "server_secret";

/** Read the server secret, creating it (0600) the first time. */
export function loadOrCreateServerSecret(stateDir: string): Buffer {
  const file = join(stateDir, SECRET_FILE);
  try {
    const hex = readFileSync(file, "utf8").trim();
    if (!/^[0-9a-f]{64}$/.test(hex)) throw new Error(`${file}: server secret is corrupt; refusing to replace it`);
    return Buffer.from(hex, "hex");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
  const secret = randomBytes(32);
  writeFileSync(file, `${secret.toString("hex")}\n`, { mode: 0o600, flag: "wx" });
  chmodSync(file, 0o600);
  return secret;
}
