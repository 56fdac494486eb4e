/**
 * A webhook receiver for the bench: a real `node:http` server on 127.0.0.1 answering every request 200, that
 * stamps when each request's body has fully arrived (the ledger's clock, `hrNow`) and indexes it by the
 * event's `type` and `data.run_id`. It does not verify signatures (the tests do); it only times arrivals.
 */
import { createServer } from "node:http";
import { hrNow } from "./stats.mjs";

/** Bytes of one request body the receiver reads at most (the Server's bodies are well under 1 KB). */
const MAX_BODY_BYTES = 64 * 1024;
/** Most arrivals the receiver keeps (the bench's runs send a few each). */
const MAX_ARRIVALS = 100_000;

export async function startReceiver() {
  /** `${run_id} ${type}` → arrival times, in order. */
  const arrivals = new Map();
  const waiters = new Map();
  let count = 0;
  const server = createServer((req, res) => {
    const chunks = [];
    let size = 0;
    req.on("data", (c) => {
      size += c.length;
      if (size <= MAX_BODY_BYTES) chunks.push(c);
    });
    req.on("end", () => {
      const at = hrNow();
      res.writeHead(200, { "content-type": "text/plain" }).end("ok");
      let body;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      } catch {
        return;
      }
      if (count >= MAX_ARRIVALS) return;
      count++;
      const key = `${body?.data?.run_id} ${body?.type}`;
      const list = arrivals.get(key) ?? [];
      list.push(at);
      arrivals.set(key, list);
      const wake = waiters.get(key);
      if (wake) {
        waiters.delete(key);
        wake(at);
      }
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}/hook`,
    /** How many events arrived for `runId` of `type` (more than 1: a redelivery). */
    count: (runId, type) => arrivals.get(`${runId} ${type}`)?.length ?? 0,
    /** The first arrival of `type` for `runId` (ms, ledger clock), waiting at most `timeoutMs`; null past it. */
    arrival(runId, type, timeoutMs) {
      const key = `${runId} ${type}`;
      const seen = arrivals.get(key);
      if (seen) return Promise.resolve(seen[0]);
      return new Promise((resolve) => {
        const timer = setTimeout(() => {
          waiters.delete(key);
          resolve(null);
        }, timeoutMs);
        waiters.set(key, (at) => {
          clearTimeout(timer);
          resolve(at);
        });
      });
    },
    total: () => count,
    close() {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}
