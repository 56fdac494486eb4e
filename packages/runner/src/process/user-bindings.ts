/**
 * Which caller each run_as pool user serves (design §4.2): two runs of different callers never share a
 * user, live or one after the other. A run leaves files in its user's home and temp dirs that the sweep
 * does not remove (an agent's session logs, caches, a planted shell rc), and the next run of that user could
 * read or run them; so a pool user is bound to the tenant of the first run it serves and from then on serves
 * only that tenant's runs. The binding is written (durably) before the run's agent starts, and outlives
 * Runner restarts and `--new-store`: it lives in its own file in the state dir, `run-as-bindings.json`.
 *
 * The tenant is the opaque tag `run.start` carries (an HMAC of the principal under the Server's secret); a
 * start without one (a Server that predates tags) counts as the tenant NO_TENANT. `[acp] single_tenant`
 * switches binding off. The operator frees a user with `webcodex-runner pool release USER` after cleaning
 * its home (commands/pool.ts); the Runner itself recycles a user whose tenant left it unused for
 * `binding_idle_days` (process/user-pool.ts, with its home wiped by process/pool-homes.ts).
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { TenantTag } from "@webcodex/protocol";
import { z } from "zod";
import { writeFileDurably } from "../durable-file.js";

/** Its name in the state dir. */
export const BINDINGS_FILE = "run-as-bindings.json";
/** The tenant of a start that names none. */
export const NO_TENANT = "untagged";
/** Most bindings the file holds (every pool user of every agent, with room for users dropped from the config). */
export const MAX_BINDINGS = 4096;
/** Largest bindings file read; a bigger one is refused, not truncated. */
export const MAX_BINDINGS_FILE_BYTES = 1 << 20;
/** A binding's `last_used_at` is rewritten at most this often (each write is an fsync on the start path). */
export const BINDING_TOUCH_INTERVAL_MS = 60 * 60 * 1000;

const Binding = z
  .object({
    uid: z.number().int().min(1).max(0xffff_fffe),
    user: z.string().min(1).max(64),
    tenant: z.union([TenantTag, z.literal(NO_TENANT)]),
    bound_at: z.iso.datetime(),
    /** When a run of the tenant last took or gave back the user (BINDING_TOUCH_INTERVAL_MS granularity); absent: bound_at. */
    last_used_at: z.iso.datetime().optional(),
  })
  .strict();
const BindingsFile = z.object({ version: z.literal(1), bindings: z.array(Binding).max(MAX_BINDINGS) }).strict();

export type UserBinding = z.infer<typeof Binding>;

/** The bindings file is unreadable or malformed: the Runner does not guess who a user served. */
export class BindingsFileError extends Error {
  override readonly name = "BindingsFileError";
}

/** Where bindings are kept. */
export interface PoolBindings {
  /** Every binding, by uid. */
  load(): Map<number, UserBinding>;
  /** Record `binding`, durably, before the run's agent starts (throws when it cannot). */
  bind(binding: UserBinding): void;
}

export class FilePoolBindings implements PoolBindings {
  readonly file: string;
  #bindings: Map<number, UserBinding> | null = null;

  constructor(stateDir: string) {
    this.file = join(stateDir, BINDINGS_FILE);
  }

  load(): Map<number, UserBinding> {
    this.#bindings ??= readBindings(this.file);
    return new Map(this.#bindings);
  }

  bind(binding: UserBinding): void {
    const next = this.load();
    next.set(binding.uid, binding);
    writeBindings(this.file, next);
    this.#bindings = next;
  }

  /** Forget `uid`'s binding; false when it had none. */
  release(uid: number): boolean {
    const next = this.load();
    if (!next.delete(uid)) return false;
    writeBindings(this.file, next);
    this.#bindings = next;
    return true;
  }
}

function readBindings(file: string): Map<number, UserBinding> {
  let text: string;
  try {
    const bytes = readFileSync(file);
    if (bytes.byteLength > MAX_BINDINGS_FILE_BYTES) {
      throw new BindingsFileError(`${file}: larger than ${MAX_BINDINGS_FILE_BYTES} bytes`);
    }
    text = bytes.toString("utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return new Map();
    if (error instanceof BindingsFileError) throw error;
    throw new BindingsFileError(`${file}: cannot be read (${(error as NodeJS.ErrnoException).code ?? "error"})`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    throw new BindingsFileError(`${file}: not JSON`);
  }
  const parsed = BindingsFile.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new BindingsFileError(`${file}: ${issue?.path.join(".") || "(root)"}: ${issue?.message ?? "malformed"}`);
  }
  const out = new Map<number, UserBinding>();
  for (const b of parsed.data.bindings) out.set(b.uid, b);
  return out;
}

function writeBindings(file: string, bindings: Map<number, UserBinding>): void {
  if (bindings.size > MAX_BINDINGS) throw new BindingsFileError(`${file}: more than ${MAX_BINDINGS} bindings`);
  const list = [...bindings.values()].sort((a, b) => a.uid - b.uid);
  writeFileDurably(file, `${JSON.stringify({ version: 1, bindings: list }, null, 2)}\n`);
}
