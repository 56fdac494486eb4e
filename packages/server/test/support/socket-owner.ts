/**
 * Which of some processes owns one end of an open loopback TCP connection (Linux /proc): the webhook tests ask
 * it, while a receiver's request is still unanswered, which Server instance made the attempt. The connection
 * is found in /proc/net/tcp by its two ports, and its socket inode among the candidates' open descriptors.
 */
import { readdirSync, readFileSync, readlinkSync } from "node:fs";

/** The socket inode of the loopback connection from `localPort` to `remotePort`, or undefined. */
function socketInode(localPort: number, remotePort: number): string | undefined {
  const hexPort = (p: number) => p.toString(16).toUpperCase().padStart(4, "0");
  for (const file of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    let text: string;
    try {
      text = readFileSync(file, "utf8");
    } catch {
      continue;
    }
    for (const line of text.split("\n").slice(1)) {
      const cols = line.trim().split(/\s+/);
      if (cols.length < 10) continue;
      if (cols[1]?.endsWith(`:${hexPort(localPort)}`) && cols[2]?.endsWith(`:${hexPort(remotePort)}`)) return cols[9];
    }
  }
  return undefined;
}

/** The pid among `pids` holding the connection from `localPort` to `remotePort` open, or undefined. */
export function socketOwner(localPort: number, remotePort: number, pids: readonly number[]): number | undefined {
  const inode = socketInode(localPort, remotePort);
  if (inode === undefined || inode === "0") return undefined;
  const target = `socket:[${inode}]`;
  for (const pid of pids) {
    let fds: string[];
    try {
      fds = readdirSync(`/proc/${pid}/fd`);
    } catch {
      continue;
    }
    for (const fd of fds) {
      try {
        if (readlinkSync(`/proc/${pid}/fd/${fd}`) === target) return pid;
      } catch {
        // Closed meanwhile.
      }
    }
  }
  return undefined;
}
