/**
 * The Runner's local structured log: pino, JSON lines on stderr. What may be
 * logged: ids, states, kinds, exit codes/signals, numeric JSON-RPC codes,
 * sizes and counts. Never env values, argv, stderr text, prompt or message
 * bodies, ACP session ids or provider error text.
 */
import { pino } from "pino";

export type Logger = pino.Logger;

export function createLogger(level: string = "info", bindings: Record<string, string> = {}): Logger {
  return pino(
    { level, base: { name: "webcodex-runner", ...bindings }, timestamp: pino.stdTimeFunctions.isoTime },
    pino.destination({ dest: 2, sync: true }),
  );
}

/** A logger that drops everything (tests, library users that bring none). */
export function silentLogger(): Logger {
  return pino({ level: "silent" });
}
