/**
 * A loopback HTTP proxy that adds `Authorization: Bearer TOKEN` to every
 * request and forwards it to the Server unchanged otherwise — Host and Origin
 * included, so a client that cannot send a bearer token (the MCP conformance
 * suite) still exercises the Server's Host/Origin checks past authentication.
 * Responses (SSE streams included) are piped back as they arrive.
 */
import { createServer, request } from "node:http";

/** Starts the proxy on 127.0.0.1 (port 0 = any free port); resolves with {port, close()}. */
export function startAuthProxy({ targetPort, token, port = 0 }) {
  const server = createServer((req, res) => {
    const upstream = request(
      {
        host: "127.0.0.1",
        port: targetPort,
        path: req.url,
        method: req.method,
        headers: { ...req.headers, authorization: `Bearer ${token}` },
      },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    upstream.on("error", () => {
      if (!res.headersSent) res.writeHead(502);
      res.end();
    });
    req.pipe(upstream);
    res.on("close", () => upstream.destroy());
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, "127.0.0.1", () => {
      resolve({
        port: server.address().port,
        close: () =>
          new Promise((r) => {
            server.closeAllConnections();
            server.close(() => r());
          }),
      });
    });
  });
}
