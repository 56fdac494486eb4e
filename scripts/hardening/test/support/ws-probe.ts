/**
 * One WebSocket connection under test: collects the frames it receives, how it
 * closed, and sends text, invalid-UTF-8 or binary frames on request.
 */
import WebSocket from "ws";

export interface Probe {
  ws: WebSocket;
  frames: Array<Record<string, unknown>>;
  /** Resolves with the close code once the connection is closed (or failed to open: 0). */
  closed: Promise<number>;
  opened: Promise<boolean>;
}

export function openProbe(url: string, headers: Record<string, string>): Probe {
  const ws = new WebSocket(url, { headers, maxPayload: 4 * 1024 * 1024 });
  const frames: Array<Record<string, unknown>> = [];
  ws.on("message", (d) => {
    try {
      frames.push(JSON.parse(String(d)) as Record<string, unknown>);
    } catch {
      frames.push({ type: "__unparseable__" });
    }
  });
  ws.on("error", () => {});
  const closed = new Promise<number>((resolve) => ws.on("close", (code) => resolve(code)));
  const opened = new Promise<boolean>((resolve) => {
    ws.once("open", () => resolve(true));
    ws.once("close", () => resolve(false));
  });
  return { ws, frames, closed, opened };
}

export function sendRaw(ws: WebSocket, data: string | Buffer, binary: boolean): void {
  ws.send(data, { binary });
}

/** Resolves with the first received frame matching `pred`, or undefined once the connection closes or `ms` pass. */
export async function nextFrame(
  p: Probe,
  pred: (f: Record<string, unknown>) => boolean,
  ms: number,
): Promise<Record<string, unknown> | undefined> {
  const deadline = Date.now() + ms;
  let closed = false;
  void p.closed.then(() => {
    closed = true;
  });
  for (;;) {
    const hit = p.frames.find(pred);
    if (hit) return hit;
    if (closed || Date.now() > deadline) return undefined;
    await new Promise((r) => setTimeout(r, 5));
  }
}

export async function closedWithin(p: Probe, ms: number): Promise<number | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<undefined>((r) => {
    timer = setTimeout(() => r(undefined), ms);
  });
  const code = await Promise.race([p.closed, timeout]);
  clearTimeout(timer);
  return code;
}
