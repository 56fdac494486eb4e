/**
 * Reading a bounded HTTP body: a request the Server answers (mcp/post.ts) or a response it reads from a
 * peer instance (link/peer-http.ts). Both are `IncomingMessage`s.
 */
import type { IncomingMessage } from "node:http";

export const TOO_LARGE = Symbol("too large");
export const ABORTED = Symbol("aborted");

/**
 * The body as UTF-8 text; TOO_LARGE when it is (or declares itself) larger than `max` bytes, ABORTED
 * when the other side went away before its end. On TOO_LARGE the caller ends the exchange.
 */
export function readBody(msg: IncomingMessage, max: number): Promise<string | typeof TOO_LARGE | typeof ABORTED> {
  const declared = Number(msg.headers["content-length"]);
  if (Number.isFinite(declared) && declared > max) return Promise.resolve(TOO_LARGE);
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer) => {
      size += chunk.byteLength;
      if (size > max) {
        msg.off("data", onData);
        resolve(TOO_LARGE);
        return;
      }
      chunks.push(chunk);
    };
    msg.on("data", onData);
    msg.once("end", () => resolve(Buffer.concat(chunks, size).toString("utf8")));
    // After "end" (or a refusal) this settles nothing: a promise resolves once.
    msg.once("close", () => resolve(ABORTED));
    msg.once("error", () => resolve(ABORTED));
  });
}
