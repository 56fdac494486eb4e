/**
 * Vitest global setup of the PostgreSQL pass (`vitest.postgres.config.ts`): one throwaway PostgreSQL
 * cluster for the whole pass. Its superuser URL reaches the test workers as WEBCODEX_TEST_POSTGRES_ADMIN_URL;
 * every test stack (packages/server/test/support/proc-stack.ts) then keeps its Server's state in a fresh
 * database of its own there instead of the SQLite file, so the same suites run on both engines.
 */
import { type PostgresCluster, startPostgresCluster } from "../test-support/postgres.js";

/** The variable the workers read (proc-stack.ts TEST_POSTGRES_ADMIN_URL_ENV). */
const ADMIN_URL_ENV = "WEBCODEX_TEST_POSTGRES_ADMIN_URL";

let cluster: PostgresCluster | null = null;

export async function setup(): Promise<void> {
  cluster = await startPostgresCluster();
  process.env[ADMIN_URL_ENV] = cluster.adminUrl;
}

export async function teardown(): Promise<void> {
  await cluster?.close();
  cluster = null;
}
