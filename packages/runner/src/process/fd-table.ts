/**
 * Every agent starts with a descriptor table it will not have to grow while it boots.
 *
 * Linux sizes a forked child's descriptor table from the parent's highest open
 * descriptor, and exec keeps that table. Growing a table that threads share
 * waits for an RCU grace period (expand_files → synchronize_rcu), and a Node
 * agent has threads from its first millisecond. Loading its modules, such an
 * agent holds more than 64 descriptors for a moment (the ESM loader reads files
 * in parallel), so an agent forked from a Runner whose descriptors all sat below
 * 64 paid that wait during its start-up: 12–17 ms of a ~110 ms start on a 2-vCPU
 * VM, measured with `perf sched` (issue 17; scripts/bench/README.md).
 *
 * The Runner therefore holds one close-on-exec descriptor (/dev/null) at slot
 * AGENT_FD_TABLE_SLOTS − 1 or above: every fork copies a table of at least that
 * many slots, and exec closes the descriptor itself, so the agent never holds it.
 * Linux only; elsewhere nothing is reserved.
 */
import { closeSync, openSync } from "node:fs";

/** Slots of the descriptor table every agent starts with (a table grows in powers of two). */
export const AGENT_FD_TABLE_SLOTS = 256;

let reserved: number | null | undefined;

/**
 * Open /dev/null until the descriptor it gets is at `slots − 1` or above, keep that one, close the rest.
 * Idempotent; returns the kept descriptor, or null where nothing was reserved (not Linux, or the
 * descriptor limit is below `slots`: agents then start with a smaller table, nothing else changes).
 */
export function reserveAgentFdTable(slots: number = AGENT_FD_TABLE_SLOTS): number | null {
  if (reserved !== undefined) return reserved;
  reserved = null;
  if (process.platform !== "linux") return null;
  const below: number[] = [];
  try {
    // openSync takes the lowest free descriptor: at most `slots` opens reach slot `slots − 1`.
    for (let i = 0; i < slots; i++) {
      const fd = openSync("/dev/null", "r");
      if (fd >= slots - 1) {
        reserved = fd;
        break;
      }
      below.push(fd);
    }
  } catch {
    // EMFILE: a descriptor limit below `slots`.
  } finally {
    for (const fd of below) closeSync(fd);
  }
  return reserved;
}
