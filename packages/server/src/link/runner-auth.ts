/**
 * Which runner a bearer token is (link/hub.ts, at every upgrade): sha256 digests compared in constant
 * time against every binding's current token, a rotated one (link/runner-tokens.ts, state DB) winning
 * over the config's; and whether a connection's token is still its runner's after a rotation.
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import type { Logger } from "pino";
import type { RunnerBinding } from "../config.js";
import type { RunnerTokenStore } from "./runner-tokens.js";

/** The token hash a runner authenticates with now: a rotated one (state DB) wins over the config's. */
function tokenHashOf(binding: RunnerBinding, overrides: ReadonlyMap<string, Buffer>): Buffer {
  return overrides.get(binding.id) ?? binding.tokenHash;
}

export class RunnerAuth {
  readonly #bindings: readonly RunnerBinding[];
  readonly #bindingById: ReadonlyMap<string, RunnerBinding>;
  readonly #tokens: RunnerTokenStore | undefined;
  readonly #log: Logger;

  /** `tokens`: rotated runner tokens (state DB); without it, the config's tokens only. */
  constructor(bindings: readonly RunnerBinding[], tokens: RunnerTokenStore | undefined, log: Logger) {
    this.#bindings = bindings;
    this.#bindingById = new Map(bindings.map((b) => [b.id, b]));
    this.#tokens = tokens;
    this.#log = log;
  }

  async warnRotated(): Promise<void> {
    const tokens = this.#tokens;
    if (!tokens) return;
    try {
      const overrides = await tokens.overrides();
      const rotated = this.#bindings.filter((b) => overrides.has(b.id)).map((b) => b.id);
      if (rotated.length === 0) return;
      this.#log.warn(
        { runners: rotated.slice(0, 16) },
        "these runners' tokens were rotated (webcodex-server runner-token rotate): their [[runners]] " +
          "token_sha256/token_env are not used",
      );
    } catch (err) {
      this.#log.error({ err: (err as Error).message }, "reading rotated runner tokens failed");
    }
  }

  /** Rotated token hashes, read now (one query); none without a token store. */
  async overrides(): Promise<ReadonlyMap<string, Buffer>> {
    return (await this.#tokens?.overrides()) ?? new Map();
  }

  /** Whether `tokenHash` is still `runnerId`'s token under `overrides` (false for a runner no longer bound). */
  isCurrent(runnerId: string, tokenHash: Buffer, overrides: ReadonlyMap<string, Buffer>): boolean {
    const binding = this.#bindingById.get(runnerId);
    return binding !== undefined && tokenHashOf(binding, overrides).equals(tokenHash);
  }

  /**
   * Map a bearer token to its runner id, comparing sha256 digests in constant time against every binding's
   * current token (rotated or configured).
   */
  async authenticate(authorization: string | undefined): Promise<{ runnerId: string; tokenHash: Buffer } | null> {
    const m = /^Bearer ([\x21-\x7e]{1,4096})$/.exec(authorization ?? "");
    const digest = createHash("sha256")
      .update(m?.[1] ?? randomBytes(16).toString("hex"), "utf8")
      .digest();
    // Read at every upgrade (one query): a rotation by the CLI or another instance applies at once.
    const overrides = await this.overrides();
    let found: string | null = null;
    for (const b of this.#bindings) {
      const hash = tokenHashOf(b, overrides);
      if (hash.byteLength === digest.byteLength && timingSafeEqual(hash, digest) && m) found = b.id;
    }
    return found === null ? null : { runnerId: found, tokenHash: digest };
  }
}
