/**
 * The Runner's software version: its package.json `version`, read once at load, so it is said in one place.
 * Sent in `hello` (the operator console shows it) and as the ACP client's `clientInfo.version`.
 */
import { createRequire } from "node:module";

export const RUNNER_VERSION: string = (createRequire(import.meta.url)("../package.json") as { version: string })
  .version;
