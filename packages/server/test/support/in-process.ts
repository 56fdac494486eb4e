/** In-process Server + Runner links for unit tests (real ws, real SQLite in a temp dir). */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Logger, pino } from "pino";
import { type LinkHandle, startLink } from "../../../runner/src/link/link.js";
import { buildServerConfig, type ServerConfig, sha256Hex } from "../../src/config.js";
import type { Principal, Scope } from "../../src/runs/api.js";
import { type RunningServer, startServer } from "../../src/server.js";
import type { FakeRunService } from "./fake-run-service.js";

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

export function makeConfig(dir: string, runners: RunnerDef[], extraPrincipals: unknown[] = []): ServerConfig {
  return buildServerConfig(
    {
      server: { host: "127.0.0.1", port: 0, state_dir: "state", heartbeat_interval_ms: 1000 },
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

export class Harness {
  readonly dir = mkdtempSync(join(tmpdir(), "wc-server-"));
  readonly log = captureLogger();
  server!: RunningServer;
  config!: ServerConfig;
  readonly links: LinkHandle[] = [];

  async start(
    runners: RunnerDef[],
    env: NodeJS.ProcessEnv = {},
    opts: { startTimeoutMs?: number } = {},
  ): Promise<this> {
    this.config = makeConfig(this.dir, runners);
    this.server = await startServer({ config: this.config, logger: this.log.logger, env, ...opts });
    return this;
  }

  async restartServer(env: NodeJS.ProcessEnv = {}): Promise<void> {
    this.config = { ...this.config, port: this.server.port };
    await this.server.close();
    this.server = await startServer({ config: this.config, logger: this.log.logger, env });
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
