/**
 * Which caller a shared project serves under run_as (design §4.2, §16; issue 39 §2). Runs of one project
 * share its tree: what one run writes there (a Makefile, a package script, a nested repository, the git
 * index) the next run reads and may execute, as that run's pool user with that run's prompt and
 * environment. Pool users keep two callers' runs apart (process/user-bindings.ts) only if the project does
 * too: so a project served to run_as agents is bound to the caller (tenant tag) of its first such run and
 * serves only that caller's runs, unless the operator marks it `shared_between_callers = true` (the
 * documented risk). `[acp] single_tenant` switches this off as it does user bindings.
 *
 * The binding is written durably before the run is admitted, and outlives Runner restarts and
 * `--new-store`: it lives in its own file in the state dir, PROJECT_CALLERS_FILE. The operator frees a
 * project by removing its entry (Runner stopped), after checking its tree (docs/operating.md).
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { LOCAL_ID_PATTERN, MAX_PROJECTS, TenantTag } from "@webcodex/protocol";
import { z } from "zod";
import { writeFileDurably } from "../durable-file.js";
import { NO_TENANT } from "../process/user-bindings.js";

/** Its name in the state dir. */
export const PROJECT_CALLERS_FILE = "project-callers.json";
/** Most bindings the file holds (every configured project, with room for projects dropped from the config). */
export const MAX_PROJECT_BINDINGS = MAX_PROJECTS * 4;
/** Largest file read; a bigger one is refused, not truncated. */
export const MAX_PROJECT_CALLERS_FILE_BYTES = 1 << 20;

/**
 * What a run of another caller is told (failed / not_started, before anything is spawned): fixed, names the
 * setting, never the other caller.
 */
export const PROJECT_SERVES_ANOTHER_CALLER =
  "This project serves another caller's runs: its runs share one tree, so this Runner gives it to one caller " +
  "only unless the operator sets shared_between_callers = true for it (design §4.2).";

const Binding = z
  .object({
    project_id: z.string().regex(LOCAL_ID_PATTERN),
    tenant: z.union([TenantTag, z.literal(NO_TENANT)]),
    bound_at: z.iso.datetime(),
  })
  .strict();
const CallersFile = z.object({ version: z.literal(1), projects: z.array(Binding).max(MAX_PROJECT_BINDINGS) }).strict();

export type ProjectBinding = z.infer<typeof Binding>;

/** The file is unreadable or malformed: the Runner does not guess which caller a project served. */
export class ProjectCallersFileError extends Error {
  override readonly name = "ProjectCallersFileError";
}

/** Where the bindings are kept. */
export interface ProjectCallers {
  /** The tenant `projectId` serves, or undefined when it is not bound yet. */
  servedBy(projectId: string): string | undefined;
  /** Record that `projectId` serves `tenant`, durably, before the run is admitted (throws when it cannot). */
  bind(projectId: string, tenant: string, at: Date): void;
}

/** In memory only: for `exec` (one run) and tests. */
export class MemoryProjectCallers implements ProjectCallers {
  readonly #tenants = new Map<string, string>();
  servedBy(projectId: string): string | undefined {
    return this.#tenants.get(projectId);
  }
  bind(projectId: string, tenant: string): void {
    this.#tenants.set(projectId, tenant);
  }
}

export class FileProjectCallers implements ProjectCallers {
  readonly file: string;
  #bindings: Map<string, ProjectBinding> | null = null;

  constructor(stateDir: string) {
    this.file = join(stateDir, PROJECT_CALLERS_FILE);
  }

  /** Reads the file (once); throws ProjectCallersFileError when it cannot be trusted. */
  load(): Map<string, ProjectBinding> {
    this.#bindings ??= readCallers(this.file);
    return new Map(this.#bindings);
  }

  servedBy(projectId: string): string | undefined {
    return this.load().get(projectId)?.tenant;
  }

  bind(projectId: string, tenant: string, at: Date): void {
    const next = this.load();
    next.set(projectId, { project_id: projectId, tenant, bound_at: at.toISOString() });
    if (next.size > MAX_PROJECT_BINDINGS) {
      throw new ProjectCallersFileError(`${this.file}: more than ${MAX_PROJECT_BINDINGS} projects`);
    }
    const list = [...next.values()].sort((a, b) => (a.project_id < b.project_id ? -1 : 1));
    writeFileDurably(this.file, `${JSON.stringify({ version: 1, projects: list }, null, 2)}\n`);
    this.#bindings = next;
  }
}

function readCallers(file: string): Map<string, ProjectBinding> {
  let text: string;
  try {
    const bytes = readFileSync(file);
    if (bytes.byteLength > MAX_PROJECT_CALLERS_FILE_BYTES) {
      throw new ProjectCallersFileError(`${file}: larger than ${MAX_PROJECT_CALLERS_FILE_BYTES} bytes`);
    }
    text = bytes.toString("utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return new Map();
    if (error instanceof ProjectCallersFileError) throw error;
    throw new ProjectCallersFileError(`${file}: cannot be read (${(error as NodeJS.ErrnoException).code ?? "error"})`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    throw new ProjectCallersFileError(`${file}: not JSON`);
  }
  const parsed = CallersFile.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new ProjectCallersFileError(
      `${file}: ${issue?.path.join(".") || "(root)"}: ${issue?.message ?? "malformed"}`,
    );
  }
  return new Map(parsed.data.projects.map((b) => [b.project_id, b]));
}
