/**
 * Reading a bounded HTTP body: a request the Server answers (mcp/post.ts, a signed cluster request, the
 * console's forms) or a response it reads from a peer instance (cluster/peer-http.ts). All are
 * `IncomingMessage`s.
 */
import type { IncomingMessage } from "node:http";

export const TOO_LARGE = Symbol("too large");
export const ABORTED = Symbol("aborted");

/**
 * The body as UTF-8 text; TOO_LARGE when it is (or declares itself) larger than `max` bytes, ABORTED
 * when the other side went away before its end. On TOO_LARGE the caller ends the exchange.
 */
export async function readBody(msg: IncomingMessage, max: number): Promise<string | typeof TOO_LARGE | typeof ABORTED> {
  const bytes = await readBodyBytes(msg, max);
  return typeof bytes === "symbol" ? bytes : bytes.toString("utf8");
}

/** The body's bytes (a signed body is verified on exactly what was sent), by the rules of `readBody`. */
export function readBodyBytes(msg: IncomingMessage, max: number): Promise<Buffer | typeof TOO_LARGE | typeof ABORTED> {
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
    msg.once("end", () => resolve(Buffer.concat(chunks, size)));
    // After "end" (or a refusal) this settles nothing: a promise resolves once.
    msg.once("close", () => resolve(ABORTED));
    msg.once("error", () => resolve(ABORTED));
  });
}
