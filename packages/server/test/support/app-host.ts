/**
 * A test MCP Apps host for the run view (design §15): a loopback page whose script (app-host-page.js, bundled
 * here with esbuild) implements the host side of ext-apps with its `AppBridge`, and a Playwright page on it
 * whose `hostCallTool` calls the real Server through an MCP client the test owns. The page's CSP, which the
 * view's srcdoc iframe inherits, allows inline script and style and nothing else: a view that tried to load a
 * script, font, image or to connect anywhere would be refused, and `requests` would show the attempt.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { build } from "esbuild";
import type { Browser, Frame, Page } from "playwright-core";

const HERE = dirname(fileURLToPath(import.meta.url));
export const RUN_VIEW_URI = "ui://webcodex/run";

/** The host page's CSP (inherited by the srcdoc view): inline script and style, nothing fetched. */
const HOST_CSP =
  "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'none'; " +
  "font-src 'none'; connect-src 'none'; frame-src 'self'; base-uri 'none'; form-action 'none'";
/** Height the view's iframe starts with (the view then reports its own through the bridge). */
const INITIAL_FRAME_HEIGHT = 480;

const HOST_HTML = `<!doctype html><html><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Test MCP Apps host</title>
<style>html,body{margin:0;background:#ececec}@media (prefers-color-scheme: dark){html,body{background:#000}}
iframe{display:block;width:100%;border:0}#host{margin:0}</style>
<script src="/host.js"></script></head><body><div id="host"></div></body></html>`;

export interface ToolCall {
  name: string;
  arguments: Record<string, unknown>;
}

export interface AppHost {
  readonly origin: string;
  /** Opens a page on the host; its view's tool calls go to `client` and are recorded in `calls`. */
  open(
    browser: Browser,
    client: Client,
    options?: { width?: number; height?: number; dark?: boolean },
  ): Promise<HostPage>;
  close(): Promise<void>;
}

export interface HostPage {
  readonly page: Page;
  /** Every tools/call the view made through the bridge, in order. */
  readonly calls: ToolCall[];
  /** Every URL the page or its frames requested (the host page and its script are the only expected ones). */
  readonly requests: string[];
  /** Renders the view as a host does after `toolInput` was called and answered `toolResult`. */
  mount(html: string, toolInput: Record<string, unknown>, toolResult: CallToolResult): Promise<Frame>;
  close(): Promise<void>;
}

/** Reads the run view's HTML from the Server, as a host does before rendering it. */
export async function readRunView(client: Client): Promise<string> {
  const read = await client.readResource({ uri: RUN_VIEW_URI });
  const content = read.contents[0] as { text?: string } | undefined;
  if (typeof content?.text !== "string") throw new Error("the run view resource has no text");
  return content.text;
}

export async function startAppHost(): Promise<AppHost> {
  const bundled = await build({
    entryPoints: [join(HERE, "app-host-page.js")],
    bundle: true,
    write: false,
    format: "iife",
    platform: "browser",
    logLevel: "warning",
  });
  const script = bundled.outputFiles[0]?.text ?? "";
  const server: Server = createServer((req, res) => {
    res.setHeader("content-security-policy", HOST_CSP);
    res.setHeader("cache-control", "no-store");
    if (req.url === "/") res.writeHead(200, { "content-type": "text/html; charset=utf-8" }).end(HOST_HTML);
    else if (req.url === "/host.js") res.writeHead(200, { "content-type": "text/javascript" }).end(script);
    else res.writeHead(404).end();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;

  return {
    origin,
    async open(browser, client, options = {}) {
      const width = options.width ?? 1024;
      const height = options.height ?? 800;
      const context = await browser.newContext({
        viewport: { width, height },
        colorScheme: options.dark ? "dark" : "light",
      });
      // ext-apps' transport logs every message with console.debug (on both sides); the browser copies its console
      // to stderr, which would drown the test output. Every frame, the view's too, gets a silent console.debug.
      await context.addInitScript(() => {
        console.debug = () => {};
      });
      const page = await context.newPage();
      const calls: ToolCall[] = [];
      const requests: string[] = [];
      page.on("request", (r) => requests.push(r.url()));
      await page.exposeFunction("hostCallTool", async (params: ToolCall) => {
        calls.push({ name: params.name, arguments: { ...params.arguments } });
        return client.callTool({ name: params.name, arguments: params.arguments });
      });
      await page.goto(`${origin}/`);
      return {
        page,
        calls,
        requests,
        close: () => context.close(),
        async mount(html, toolInput, toolResult) {
          await page.evaluate(
            (a) => (globalThis as unknown as { mountRunView: (x: unknown) => Promise<void> }).mountRunView(a),
            {
              html,
              toolInput,
              toolResult,
              theme: options.dark ? "dark" : "light",
              height: INITIAL_FRAME_HEIGHT,
            },
          );
          const frame = page.frames().find((f) => f !== page.mainFrame());
          if (!frame) throw new Error("the run view's frame did not appear");
          return frame;
        },
      };
    },
    async close() {
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
