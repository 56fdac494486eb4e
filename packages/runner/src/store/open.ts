/**
 * Opening the dispatch store (design §4.4) with its marker file: the store's
 * identity outside the database. A restarted Runner tells "first start" (no
 * marker, no database: create both) from "the store that existed is gone" (a
 * marker without its database, or a database that is not it: refuse with exit
 * code 3 and an operator message, never silently recreate). `--new-store`
 * moves the old files aside, never deletes them. The store itself, its schema
 * and its durability rules: store/dispatch-store.ts.
 */
import {
  closeSync,
  existsSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { dirname, join } from "node:path";
import Database from "better-sqlite3";
import { isBusy, LOCK_WAIT_MS, nowIso, SqliteDispatchStore, StoreFileError } from "./dispatch-store.js";

type Db = Database.Database;

export const STORE_DB_FILE = "dispatch.sqlite";
export const STORE_MARKER_FILE = "store.json";
/** Exit code of a Runner that refuses to start because of its store. */
export const STORE_REFUSAL_EXIT_CODE = 3;

export type StoreRefusalReason =
  | "missing"
  | "corrupt"
  | "integrity"
  | "not_a_store"
  | "mismatch"
  | "marker_corrupt"
  | "locked";

/** The Runner must not start on this store; the message is for the operator. */
export class StoreRefusedError extends Error {
  override readonly name = "StoreRefusedError";
  readonly exitCode = STORE_REFUSAL_EXIT_CODE;
  constructor(
    readonly reason: StoreRefusalReason,
    readonly file: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

// ---- opening with the marker ---------------------------------------------------

interface Marker {
  store_id: string;
  created_at: string;
  db_file: string;
}

function readMarker(path: string): Marker | "corrupt" | null {
  if (!existsSync(path)) return null;
  try {
    const value: unknown = JSON.parse(readFileSync(path, "utf8"));
    if (typeof value === "object" && value !== null && typeof (value as Marker).store_id === "string") {
      return value as Marker;
    }
    return "corrupt";
  } catch {
    return "corrupt";
  }
}

/** Make a rename or create in `dir` durable (Linux: fsync the directory). */
function fsyncDir(dir: string): void {
  let fd: number | undefined;
  try {
    fd = openSync(dir, "r");
    fsyncSync(fd);
  } catch {
    // Not supported on every platform/filesystem; the data files themselves are fsync'd.
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/** Write a small file durably: temp file, fsync, rename, fsync the directory. */
function writeFileDurably(path: string, text: string): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, text, { flush: true });
  renameSync(tmp, path);
  fsyncDir(dirname(path));
}

function refuseHint(dbPath: string): string {
  return (
    `Nothing was changed. Restore ${dbPath} from a backup, or start a fresh store with ` +
    "`webcodex-runner run --config <file> --new-store` (the old files are moved aside, never deleted; " +
    "runs recorded in the old store will be reported as lost by the Server)."
  );
}

export interface OpenStoreOptions {
  stateDir: string;
  /** Operator flag: move an existing store aside and create a new store_id. */
  newStore?: boolean;
  now?: Date;
}

export interface OpenedStore {
  store: SqliteDispatchStore;
  /** true when this call created the database (first start or --new-store). */
  created: boolean;
  /** Files moved aside by --new-store (absolute paths). */
  movedAside: string[];
}

function sqliteFiles(dbPath: string): string[] {
  return [dbPath, `${dbPath}-wal`, `${dbPath}-shm`];
}

/**
 * Open the Runner's dispatch store in `stateDir`, enforcing the store-identity
 * rules. Throws StoreRefusedError (exit code 3) when the Runner must not start.
 */
export function openDispatchStore(options: OpenStoreOptions): OpenedStore {
  const { stateDir } = options;
  // Readable by the Runner's user only (design §4.2); an existing dir keeps its mode (the daemon warns).
  mkdirSync(stateDir, { recursive: true, mode: 0o700 });
  const dbPath = join(stateDir, STORE_DB_FILE);
  const markerPath = join(stateDir, STORE_MARKER_FILE);
  const movedAside: string[] = [];

  if (options.newStore) {
    assertNotInUse(dbPath);
    const stamp = (options.now ?? new Date()).toISOString().replace(/[:.]/g, "-");
    for (const file of [...sqliteFiles(dbPath), markerPath]) {
      if (existsSync(file)) {
        const target = `${file}.replaced-${stamp}`;
        renameSync(file, target);
        movedAside.push(target);
      }
    }
  }

  const marker = readMarker(markerPath);
  if (marker === "corrupt") {
    throw new StoreRefusedError(
      "marker_corrupt",
      markerPath,
      `The Runner's store marker ${markerPath} is unreadable, so the identity of the store cannot be checked. ` +
        refuseHint(dbPath),
    );
  }

  if (!existsSync(dbPath)) {
    if (marker !== null) {
      throw new StoreRefusedError(
        "missing",
        dbPath,
        `The Runner's dispatch store ${dbPath} is missing, but ${markerPath} shows store ${marker.store_id} ` +
          "existed here. Starting without it could re-dispatch prompts or forget runs. " +
          refuseHint(dbPath),
      );
    }
    return { store: createFresh(dbPath, markerPath), created: true, movedAside };
  }

  let store: SqliteDispatchStore;
  try {
    store = SqliteDispatchStore.openFile(dbPath, { create: false });
  } catch (error) {
    if (isBusy(error)) throw lockedRefusal(dbPath, error);
    if (error instanceof StoreFileError && error.reason === "integrity") {
      throw new StoreRefusedError(
        "integrity",
        dbPath,
        `The Runner's dispatch store ${dbPath} failed PRAGMA integrity_check. ${refuseHint(dbPath)}`,
        { cause: error },
      );
    }
    throw new StoreRefusedError(
      error instanceof StoreFileError ? "not_a_store" : "corrupt",
      dbPath,
      `The Runner's dispatch store ${dbPath} cannot be opened (${describeSqliteError(error)}). ${refuseHint(dbPath)}`,
      { cause: error },
    );
  }
  if (marker !== null && marker.store_id !== store.storeId) {
    store.close();
    throw new StoreRefusedError(
      "mismatch",
      dbPath,
      `The Runner's dispatch store ${dbPath} holds store ${store.storeId}, but ${markerPath} names store ` +
        `${marker.store_id}: the database was replaced. ` +
        refuseHint(dbPath),
    );
  }
  if (marker === null) {
    // A database from before markers existed, or a crash between creating the DB and the marker.
    writeMarker(markerPath, store.storeId);
  }
  return { store, created: false, movedAside };
}

function lockedRefusal(dbPath: string, cause: unknown): StoreRefusedError {
  return new StoreRefusedError(
    "locked",
    dbPath,
    `The Runner's dispatch store ${dbPath} is in use by another process (is another Runner running with the same ` +
      "state_dir?). Stop that process first; nothing was changed.",
    { cause },
  );
}

/**
 * Whether another process — a Runner daemon — holds the dispatch store of `stateDir` open (it keeps SQLite's
 * exclusive lock while it runs). Creates nothing: no store there means nobody holds it.
 */
export function storeInUse(stateDir: string): boolean {
  try {
    assertNotInUse(join(stateDir, STORE_DB_FILE));
    return false;
  } catch (error) {
    if (error instanceof StoreRefusedError) return true;
    throw error;
  }
}

/** Refuse to move a store aside while another process holds it open. */
function assertNotInUse(dbPath: string): void {
  if (!existsSync(dbPath)) return;
  let db: Db | undefined;
  try {
    db = new Database(dbPath, { fileMustExist: true, timeout: LOCK_WAIT_MS });
    db.pragma("locking_mode = EXCLUSIVE");
    db.exec("BEGIN EXCLUSIVE; COMMIT");
  } catch (error) {
    if (isBusy(error)) throw lockedRefusal(dbPath, error);
    // Any other failure (not a database, corrupt): it is being moved aside anyway.
  } finally {
    db?.close();
  }
}

function writeMarker(markerPath: string, storeId: string): void {
  const marker: Marker = { store_id: storeId, created_at: nowIso(), db_file: STORE_DB_FILE };
  writeFileDurably(markerPath, `${JSON.stringify(marker, null, 2)}\n`);
}

/**
 * Create the database under a temporary name and rename it into place only
 * once its schema and store_id are committed, so a crash mid-creation never
 * leaves an empty file that looks like a store. Then write the marker.
 */
function createFresh(dbPath: string, markerPath: string): SqliteDispatchStore {
  const tmp = `${dbPath}.init-${process.pid}`;
  for (const file of sqliteFiles(tmp)) rmSync(file, { force: true });
  const initial = SqliteDispatchStore.openFile(tmp, { create: true });
  const storeId = initial.storeId;
  // Fold the WAL into the main file so the renamed file is complete on its own.
  initial.checkpoint();
  initial.close();
  for (const file of sqliteFiles(tmp).slice(1)) rmSync(file, { force: true });
  renameSync(tmp, dbPath);
  fsyncDir(dirname(dbPath));
  const store = SqliteDispatchStore.openFile(dbPath, { create: false });
  if (store.storeId !== storeId) throw new Error("store_id changed while creating the store");
  writeMarker(markerPath, storeId);
  return store;
}

function describeSqliteError(error: unknown): string {
  if (error instanceof Error) {
    const code = (error as Error & { code?: unknown }).code;
    return typeof code === "string" ? `${code}: ${error.message}` : error.message;
  }
  return String(error);
}
