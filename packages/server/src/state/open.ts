/**
 * Opening the Server's state from its configuration (`[server.state]`): the SQLite file in the state dir
 * (the default, one Server per state dir) or a PostgreSQL database that several Server instances share.
 */
import { randomBytes } from "node:crypto";
import { StateUsageError } from "./engine.js";
import { migrateState } from "./schema.js";
import { StateStore } from "./store.js";

/**
 * What opening the state reads of the Server's configuration (config.ts `ServerConfig` has it): the state dir and
 * `[server.state]`. Stated here so that state/ stays below the config module (issue 40).
 */
export interface StateOpenConfig {
  stateDir: string;
  state: { backend: "sqlite" | "postgres"; urlEnv: string; poolSize: number };
}

/** The state `config` names: opened, migrated, with its secret. */
export async function openState(config: StateOpenConfig, env: NodeJS.ProcessEnv = process.env): Promise<StateStore> {
  const state = config.state;
  if (state.backend === "sqlite") return new StateStore(config.stateDir);
  const url = env[state.urlEnv];
  if (url === undefined || url === "") {
    throw new StateUsageError(
      `[server.state] backend = "postgres" reads the database URL from the environment variable ${state.urlEnv} ` +
        "(url_env), which is not set. Set it to postgres://user:password@host:port/database.",
    );
  }
  return await openPostgresState(url, state.poolSize);
}

/** A PostgreSQL state: the engine (durability checked), the schema migrated once across instances, the secret. */
export async function openPostgresState(url: string, poolSize?: number): Promise<StateStore> {
  // Loaded only here: a Server on SQLite never loads the PostgreSQL client.
  const { openPostgresEngine } = await import("./engine-postgres.js");
  const engine = await openPostgresEngine({ url, ...(poolSize === undefined ? {} : { poolSize }) });
  try {
    const migrated = await migrateState(engine, "the PostgreSQL state database");
    // The first instance's secret wins; every other instance reads the same one (run ids derive from it).
    await engine.run("INSERT INTO server_secret (id, secret) VALUES (1, ?) ON CONFLICT (id) DO NOTHING", [
      randomBytes(32).toString("hex"),
    ]);
    const row = await engine.get<{ secret: string }>("SELECT secret FROM server_secret WHERE id = 1");
    if (!row || !/^[0-9a-f]{64}$/.test(row.secret)) {
      throw new StateUsageError("the server secret in the PostgreSQL state is corrupt; refusing to replace it");
    }
    return new StateStore({ engine, serverSecret: Buffer.from(row.secret, "hex"), migrated });
  } catch (err) {
    await engine.close().catch(() => undefined);
    throw err;
  }
}
