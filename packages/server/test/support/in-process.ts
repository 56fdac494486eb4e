/**
 * In-process Server + Runner links for unit tests (real ws, real SQLite in a temp dir; in the PostgreSQL
 * pass of `npm test`, a fresh database of its own on that pass's PostgreSQL instead).
 */
import { randomBytes } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Logger, pino } from "pino";
import { type LinkHandle, startLink } from "../../../runner/src/link/link.js";
import { buildServerConfig, type ServerConfig, sha256Hex } from "../../src/config.js";
import type { Principal, Scope } from "../../src/runs/api.js";
import { type RunningServer, startServer } from "../../src/server.js";
import type { SqlParam } from "../../src/state/engine.js";
import type { StateStore } from "../../src/state/store.js";
import type { FakeRunService } from "./fake-run-service.js";
import { STATE_URL_ENV, TEST_POSTGRES_ADMIN_URL_ENV } from "./proc-stack.js";

export interface LogCapture {
  logger: Logger;
  lines: string[];
}

export function captureLogger(): LogCapture {
  const lines: string[] = [];
  const logger = pino({ level: "debug" }, { write: (s: string) => lines.push(s) });
  return { logger, lines };
}

export interface RunnerDef {
  id: string;
  token: string;
  projects: string[];
}

export function makeConfig(
  dir: string,
  runners: RunnerDef[],
  extraPrincipals: unknown[] = [],
  stateUrlEnv?: string,
): ServerConfig {
  const state = stateUrlEnv === undefined ? {} : { state: { backend: "postgres", url_env: stateUrlEnv } };
  return buildServerConfig(
    {
      server: { host: "127.0.0.1", port: 0, state_dir: "state", heartbeat_interval_ms: 1000, ...state },
      runners: runners.map((r) => ({ id: r.id, token_sha256: sha256Hex(r.token), projects: r.projects })),
      principals: [
        { id: "alice", scopes: ["coding_agent:run", "project:write"], projects: ["demo", "other"] },
        { id: "bob", scopes: ["coding_agent:run", "project:write"], projects: ["demo"] },
        ...extraPrincipals,
      ],
    },
    { file: null, baseDir: dir },
  );
}

export function principal(id: string, scopes: Scope[], projects: string[]): Principal {
  return { id, scopes: new Set(scopes), projects: new Set(projects) };
}
export const alice = principal("alice", ["coding_agent:run", "project:write"], ["demo", "other"]);
export const bob = principal("bob", ["coding_agent:run", "project:write"], ["demo"]);

/**
 * Everything a Server's state holds, as text to search for what must not be there: on SQLite the bytes of
 * every file in its state dir (WAL checkpointed); on PostgreSQL every row of every table.
 */
export async function stateText(store: StateStore, stateDir: string): Promise<string> {
  if (store.db !== null) {
    store.sqlite.pragma("wal_checkpoint(FULL)");
    return readdirSync(stateDir)
      .map((f) => readFileSync(join(stateDir, f)).toString("latin1"))
      .join("\n");
  }
  const tables = await store.engine.all<{ name: string }>(
    "SELECT table_name AS name FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY 1",
  );
  const parts: string[] = [];
  for (const { name } of tables) parts.push(name, JSON.stringify(await store.engine.all(`SELECT * FROM "${name}"`)));
  return parts.join("\n");
}

export class Harness {
  readonly dir = mkdtempSync(join(tmpdir(), "wc-server-"));
  readonly log = captureLogger();
  server!: RunningServer;
  config!: ServerConfig;
  readonly links: LinkHandle[] = [];

  /** PostgreSQL pass: the variable `[server.state] url_env` names, and the database URL it holds. */
  #state: { env: string; url: string } | null = null;

  async start(
    runners: RunnerDef[],
    env: NodeJS.ProcessEnv = {},
    opts: { startTimeoutMs?: number } = {},
  ): Promise<this> {
    const admin = process.env[TEST_POSTGRES_ADMIN_URL_ENV];
    if (admin) {
      const { createDatabaseAt } = await import("../../../../scripts/test-support/postgres.js");
      this.#state = {
        env: `${STATE_URL_ENV}_${randomBytes(6).toString("hex").toUpperCase()}`,
        url: await createDatabaseAt(admin),
      };
    }
    this.config = makeConfig(this.dir, runners, [], this.#state?.env);
    this.server = await startServer({ config: this.config, logger: this.log.logger, env: this.#env(env), ...opts });
    if (this.#state !== null && this.server.store.engine.dialect !== "postgres") {
      throw new Error("the PostgreSQL pass started a Server that is not on PostgreSQL");
    }
    return this;
  }

  async restartServer(env: NodeJS.ProcessEnv = {}): Promise<void> {
    this.config = { ...this.config, port: this.server.port };
    await this.server.close();
    this.server = await startServer({ config: this.config, logger: this.log.logger, env: this.#env(env) });
  }

  /** Rows of a query on the Server's state, on whichever engine it uses (`?` placeholders). */
  async rows<T>(sql: string, params: readonly SqlParam[] = []): Promise<T[]> {
    return await this.server.store.engine.all<T>(sql, params);
  }

  /** Everything the Server's state holds, as text (see `stateText`). */
  async stateText(): Promise<string> {
    return await stateText(this.server.store, this.config.stateDir);
  }

  #env(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
    return this.#state === null ? env : { ...env, [this.#state.env]: this.#state.url };
  }

  wsUrl(): string {
    return `${this.server.url.replace("http", "ws")}/runner`;
  }

  link(service: FakeRunService, token: string): LinkHandle {
    const l = startLink({
      url: this.wsUrl(),
      token,
      service,
      logger: this.log.logger,
      backoffInitialMs: 50,
      backoffMaxMs: 200,
    });
    this.links.push(l);
    return l;
  }

  async close(): Promise<void> {
    await Promise.all(this.links.map((l) => l.close()));
    await this.server?.close();
    rmSync(this.dir, { recursive: true, force: true });
  }
}
