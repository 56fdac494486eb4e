/** Whether `pid` is a live process (neither gone nor a zombie). */
export declare function alive(pid: number): boolean;
/**
 * Pids of live processes other than this one whose command line contains
 * `needle`. Tests pass a path unique to them (their temp dir or ledger file),
 * which every daemon and agent they started carries in its argv.
 */
export declare function processesMentioning(needle: string): number[];
/** SIGKILL each pid; one that is already gone is skipped. */
export declare function killProcesses(pids: readonly number[]): void;
