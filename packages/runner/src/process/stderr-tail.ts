/**
 * The tail of an agent's stderr that process/spawn.ts keeps while draining it: the last STDERR_TAIL_BYTES,
 * unredacted in memory. runs/diagnostics.ts redacts it into the run's diagnostics file.
 */

/** Bytes of agent stderr kept per run (the last ones). */
export const STDERR_TAIL_BYTES = 16 * 1024;

/** Keeps the last `limit` bytes written to it. */
export class TailBuffer {
  readonly #limit: number;
  #chunks: Buffer[] = [];
  #bytes = 0;

  constructor(limit = STDERR_TAIL_BYTES) {
    this.#limit = limit;
  }

  push(chunk: Buffer): void {
    this.#chunks.push(chunk);
    this.#bytes += chunk.length;
    if (this.#bytes > 2 * this.#limit) this.#compact();
  }

  text(): string {
    this.#compact();
    return Buffer.concat(this.#chunks).toString("utf8");
  }

  #compact(): void {
    const all = Buffer.concat(this.#chunks);
    const tail = all.length > this.#limit ? all.subarray(all.length - this.#limit) : all;
    this.#chunks = [Buffer.from(tail)];
    this.#bytes = tail.length;
  }
}
