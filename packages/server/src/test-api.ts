/**
 * TEST-ONLY HTTP access to the internal RunsApi, for integration tests that
 * run the Server as a child process (e.g. kill -9 and restart). Inert unless
 * WEBCODEX_TEST_HOOK_API=1 is set in the Server's environment. The caller
 * names a principal from the config; there is no authentication — never
 * enable this outside tests. The Server refuses to start with it unless it
 * listens on a loopback address.
 *
 * POST /__test/runs/{start|observe|cancel}  body: {principal_id, input}
 * GET  /__test/projects?principal_id=ID
 * GET  /__test/cluster-stats   what the cluster paths did here (cluster/node.ts `counts`)
 * GET  /__test/cluster-peer    `{url}`: the URL this instance's peers reach it on (its directory row)
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Logger } from "pino";
import type { ServerConfig } from "./config.js";
import { ABORTED, readBody, TOO_LARGE } from "./http-body.js";
import type { Principal, Scope } from "./principals/principal.js";
import { type RunsApi, StartInput } from "./runs/api.js";
import { parseToolInput } from "./tools/input.js";

export const TEST_API_ENV = "WEBCODEX_TEST_HOOK_API";

export function principalFromConfig(config: ServerConfig, id: string): Principal | null {
  const p = config.principals.find((x) => x.id === id);
  if (!p) return null;
  return { id: p.id, scopes: new Set<Scope>(p.scopes), projects: new Set(p.projects) };
}

/** A test hook's request body is at most this long. */
const TEST_API_MAX_BODY_BYTES = 1024 * 1024;

async function readJson(req: IncomingMessage): Promise<unknown> {
  const text = await readBody(req, TEST_API_MAX_BODY_BYTES);
  if (text === TOO_LARGE) throw new Error(`body over ${TEST_API_MAX_BODY_BYTES} bytes`);
  if (text === ABORTED) throw new Error("the body ended early");
  return JSON.parse(text || "{}");
}

export function mountTestApi(
  runs: RunsApi,
  config: ServerConfig,
  logger: Logger,
  /** The URL this instance's peers reach it on (its directory row), once it has one. */
  peerUrl: () => string | null = () => null,
  /** What the cluster paths did here (cluster/node.ts `counts`). */
  clusterCounts: () => Record<string, number> = () => ({ forwarded_syncs: 0 }),
) {
  logger.warn("TEST HOOK: unauthenticated /__test API is enabled");
  return (req: IncomingMessage, res: ServerResponse): void => {
    const send = (status: number, body: unknown) =>
      res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));
    const url = new URL(req.url ?? "/", "http://x");
    void (async () => {
      try {
        if (req.method === "GET" && url.pathname === "/__test/cluster-stats") return send(200, clusterCounts());
        if (req.method === "GET" && url.pathname === "/__test/cluster-peer") return send(200, { url: peerUrl() });
        if (req.method === "GET" && url.pathname === "/__test/projects") {
          const p = principalFromConfig(config, url.searchParams.get("principal_id") ?? "");
          if (!p) return send(404, { error: "unknown principal" });
          return send(200, await runs.listProjects(p));
        }
        const m = /^\/__test\/runs\/(start|observe|cancel)$/.exec(url.pathname);
        if (req.method !== "POST" || !m) return send(404, { error: "not_found" });
        const body = (await readJson(req)) as { principal_id?: string; input?: Record<string, unknown> };
        const p = principalFromConfig(config, body.principal_id ?? "");
        if (!p) return send(404, { error: "unknown principal" });
        const input = body.input ?? {};
        if (m[1] === "start") {
          // The run core trusts its input's type: the StartInput schema is its validator here too.
          const parsed = parseToolInput(StartInput, input);
          return send(200, parsed.ok ? await runs.start(p, parsed.value) : parsed);
        }
        const result =
          m[1] === "observe" ? await runs.observe(p, input as never) : await runs.cancel(p, input as never);
        return send(200, result);
      } catch (err) {
        logger.warn({ err: (err as Error).message, path: url.pathname }, "TEST HOOK: request failed");
        return send(500, { error: "internal" });
      }
    })();
  };
}
