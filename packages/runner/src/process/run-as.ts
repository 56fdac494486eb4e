/**
 * Running an agent as other OS users (design §4.2, `[[acp.agents]] run_as`).
 *
 * An agent runs arbitrary commands; as the Runner's own user it could read
 * the Runner's token (`/proc/<runner>/environ`, the config, the token file)
 * and its dispatch store. With `run_as` the Runner starts the agent through
 * util-linux `setpriv`, which (in the child, before exec) sets
 * `no_new_privs` (setuid and file-capability binaries gain nothing), clears
 * the capability bounding set where the Runner may (CAP_SETPCAP: root does),
 * sets the real, effective and saved gid and uid, sets the supplementary
 * groups from the group database (`initgroups`: the user's groups, plus
 * `run_as_group` when given), and clears the inheritable and ambient
 * capability sets — so an agent started by a non-root Runner holding
 * CAP_SETUID/CAP_SETGID as ambient capabilities (the systemd unit) gets none
 * of them. setpriv execs the agent in place: same pid, same process group, so
 * reaping and tree cleanup work as for any agent (the Runner needs CAP_KILL,
 * or root, to signal it).
 *
 * `run_as` names a pool: one user (`run_as = "u"`, a pool of one) or several
 * (`run_as = ["u1", "u2"]`). Each concurrent run holds a user of its own and
 * every process of that user is killed before the user serves another run
 * (process/user-pool.ts); config/run-as.ts resolves and checks the pool at load, this module starts
 * the agent as one of its users.
 *
 * Node's own `uid`/`gid` spawn options are not used: they drop every
 * supplementary group and leave ambient capabilities in place.
 *
 * Users and groups are resolved once, at config load, with `getent` (so NSS
 * sources count; config/run-as.ts); tools are looked up in fixed system directories, never on PATH.
 */
import type { RunAs } from "../config/run-as.js";

/**
 * What the Runner itself sets in a run_as agent's env, over its `env_from_env` mapping: the pool user's own
 * HOME (its passwd entry: checked owner-only at start, wiped on recycle, process/pool-homes.ts) and its
 * name as USER and LOGNAME. setpriv sets none of them, and one HOME shared by a pool's users would carry
 * what one caller's run left there (logins, shell rc files, caches, ~/.gitconfig) into every other
 * caller's runs; config/config.ts refuses `env_from_env.HOME` on run_as agents for that reason.
 */
export function runAsEnv(runAs: RunAs): Record<"HOME" | "USER" | "LOGNAME", string> {
  return { HOME: runAs.home, USER: runAs.user, LOGNAME: runAs.user };
}

/** The argv that starts `executable args` as `runAs` through setpriv. */
export function setprivCommand(
  runAs: RunAs,
  executable: string,
  args: readonly string[],
): { file: string; args: string[] } {
  return {
    file: runAs.setpriv,
    args: [
      "--no-new-privs",
      ...(runAs.clearBoundingSet ? ["--bounding-set=-all"] : []),
      `--reuid=${runAs.uid}`,
      `--regid=${runAs.gid}`,
      "--init-groups",
      "--inh-caps=-all",
      "--ambient-caps=-all",
      "--",
      executable,
      ...args,
    ],
  };
}
