/**
 * `webcodex-server runner-token rotate --runner ID --config FILE` — the response to a suspected leak of a
 * Runner's token. Writes the sha256 of a fresh token to the Server's state DB (table `runner_tokens`,
 * link/runner-tokens.ts), which overrides the config's `token_sha256`/`token_env` for that runner: the old
 * token stops authenticating at once, and a running Server closes the live link that used it within
 * RUNNER_TOKEN_POLL_MS. The new token is printed once on stdout; give it to the Runner and restart it.
 */
import { loadServerConfig } from "../config.js";
import { RunnerTokenStore } from "../link/runner-tokens.js";
import { openState } from "../state/open.js";

/** Returns the process exit code. */
export async function rotateRunnerToken(configFile: string, runnerId: string): Promise<number> {
  // Other runners' token_env values play no part in a rotation: they need not be set here.
  const env = new Proxy(process.env, {
    get: (target, key) => (typeof key === "string" ? (target[key] ?? "unused-by-runner-token-rotate") : undefined),
  });
  const config = loadServerConfig(configFile, env);
  if (!config.runners.some((r) => r.id === runnerId)) {
    console.error(`runner "${runnerId}" is not declared in ${config.file}; nothing to rotate`);
    return 1;
  }
  const state = await openState(config);
  try {
    const token = await new RunnerTokenStore(state.engine).rotate(runnerId);
    console.error(
      `rotated the token of runner ${runnerId}: the old token no longer authenticates, and a running Server ` +
        "closes the link that used it. Its [[runners]] token_sha256/token_env is no longer used.",
    );
    console.error("the new token is shown once; give it to the Runner (its token_env or token_file) and restart it:");
    console.log(token);
    return 0;
  } finally {
    await state.close();
  }
}
