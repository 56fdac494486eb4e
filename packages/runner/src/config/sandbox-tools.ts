/**
 * `[acp] sandbox` at config load (design §4.2): the modes the schema accepts, the trees every sandboxed run
 * gets private (nothing an agent needs may lie there), and the tools that start an agent in its own mount
 * and IPC namespace, found once in fixed system directories (never on PATH). process/sandbox.ts builds
 * the sandboxed start from them and probes, at start, whether this Runner can make the namespaces.
 */
import { findSystemTool, type SandboxTools, SYSTEM_TOOL_DIRS } from "./run-as.js";

/** `[acp] sandbox`: `namespaces` (the default) or the explicit opt-out `none`. */
export const SANDBOX_MODES = ["namespaces", "none"] as const;
export type SandboxMode = (typeof SANDBOX_MODES)[number];

/** The trees every sandboxed run gets private and empty (so nothing the agent needs may lie in them). */
export const PRIVATE_TREES: readonly string[] = Object.freeze(["/tmp", "/var/tmp", "/dev/shm"]);

/** What a refusal offers besides the privileges: the explicit opt-out, and what it gives up. */
export const SANDBOX_OPT_OUT =
  'or set [acp] sandbox = "none" to run agents without a private /tmp, /var/tmp, /dev/shm and IPC (docs/security.md)';

export type SandboxResolution = { ok: true; tools: SandboxTools } | { ok: false; reason: string };

/** unshare, sh and mount from SYSTEM_TOOL_DIRS, or which is missing. */
export function findSandboxTools(euid: number | undefined = process.geteuid?.()): SandboxResolution {
  const unshare = findSystemTool("unshare");
  const sh = findSystemTool("sh");
  const mount = findSystemTool("mount");
  const setpriv = findSystemTool("setpriv");
  const missing = [
    ["unshare (util-linux)", unshare],
    ["sh", sh],
    ["mount (util-linux)", mount],
    ["setpriv (util-linux)", setpriv],
  ]
    .filter(([, path]) => path === null)
    .map(([name]) => name);
  if (unshare === null || sh === null || mount === null || setpriv === null) {
    return { ok: false, reason: `needs ${missing.join(", ")}, not found in ${SYSTEM_TOOL_DIRS.join(", ")}` };
  }
  return { ok: true, tools: Object.freeze({ unshare, sh, mount, asRoot: euid === 0 ? null : setpriv }) };
}
