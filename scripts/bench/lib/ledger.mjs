/** Reads the fake agent's ledger (one JSON line per received session/prompt). */
import { createHash } from "node:crypto";
import { closeSync, openSync, readSync, statSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

export function sha256(text) {
  return createHash("sha256").update(text, "utf8").digest("hex");
}

export class LedgerReader {
  constructor(file) {
    this.file = file;
    this.offset = 0;
    this.partial = "";
    this.byHash = new Map();
    this.prompts = 0;
  }

  poll() {
    let size;
    try {
      size = statSync(this.file).size;
    } catch {
      return;
    }
    if (size <= this.offset) return;
    const fd = openSync(this.file, "r");
    try {
      const buf = Buffer.alloc(size - this.offset);
      readSync(fd, buf, 0, buf.length, this.offset);
      this.offset = size;
      const text = this.partial + buf.toString("utf8");
      const lines = text.split("\n");
      this.partial = lines.pop() ?? "";
      for (const line of lines) {
        if (!line.trim()) continue;
        let entry;
        try {
          entry = JSON.parse(line);
        } catch {
          continue;
        }
        if (entry.event !== "prompt") continue;
        this.prompts++;
        const list = this.byHash.get(entry.prompt_sha256) ?? [];
        list.push(entry);
        this.byHash.set(entry.prompt_sha256, list);
      }
    } finally {
      closeSync(fd);
    }
  }

  /** The ledger entries for this exact prompt text (all of them: >1 means a duplicate dispatch). */
  entries(promptText) {
    this.poll();
    return this.byHash.get(sha256(promptText)) ?? [];
  }

  /**
   * Waits (polling every `pollMs`, default 2 ms; at most timeoutMs) for the prompt's first ledger entry.
   * The entry carries its own time (`hr_ms`), so the interval only sets when the bench notices it.
   */
  async waitFor(promptText, timeoutMs = 30_000, { pollMs = 2 } = {}) {
    const hash = sha256(promptText);
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      this.poll();
      const list = this.byHash.get(hash);
      if (list && list.length > 0) return list[0];
      await sleep(pollMs);
    }
    throw new Error(`ledger ${this.file}: no prompt entry within ${timeoutMs} ms`);
  }
}
