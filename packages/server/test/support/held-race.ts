/**
 * A race made certain: a Server child started with the `key_lookup` failpoint and the `hold_all` action
 * (src/failpoints.ts) holds every request that reaches that point until SIGUSR2. `heldRace` sends `total`
 * requests at once, waits until each of them either answered or is held at the point, then releases the held
 * ones together: every request that passed the check before the point did so before any other's effect after
 * it. Returns the answers and how many were held.
 */

import { DAEMON_POLL_MS, DAEMON_WAIT_MS, type DaemonProcess, poll } from "../../../../scripts/test-support/index.js";
import { FAILPOINT_HOLDING_LINE, SERVER_FAILPOINT_ACTION_ENV, SERVER_FAILPOINT_ENV } from "../../src/failpoints.js";

/** The Server env that arms the held key lookup. */
export const HOLD_KEY_LOOKUPS: Record<string, string> = {
  [SERVER_FAILPOINT_ENV]: "key_lookup",
  [SERVER_FAILPOINT_ACTION_ENV]: "hold_all",
};

export async function heldRace<T>(
  server: DaemonProcess,
  total: number,
  send: () => Promise<T>,
): Promise<{ answers: T[]; held: number }> {
  const line = `${FAILPOINT_HOLDING_LINE} key_lookup`;
  const heldNow = () => server.output().split(line).length - 1;
  const before = heldNow();
  let answered = 0;
  const all = Promise.all(
    Array.from({ length: total }, () =>
      send().then((a) => {
        answered += 1;
        return a;
      }),
    ),
  );
  await poll(() => answered + heldNow() - before >= total, {
    timeoutMs: DAEMON_WAIT_MS,
    intervalMs: DAEMON_POLL_MS,
    what: () =>
      `${total} requests answered or held at the key lookup (${answered} answered, ${heldNow() - before} held)`,
  });
  const held = heldNow() - before;
  server.child.kill("SIGUSR2");
  return { answers: await all, held };
}
