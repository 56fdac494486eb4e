/**
 * The run view (design §15): an MCP App (`@modelcontextprotocol/ext-apps`) that hosts with app support render
 * beside the result of the run-starting tools and `observe_coding_agent`. Those tools name the UI resource
 * `ui://webcodex/run` in their tools/list `_meta` (the extension's `_meta.ui.resourceUri`, plus the older flat
 * `ui/resourceUri` key, as the extension's own `registerAppTool` writes both); hosts without app support ignore
 * `_meta` and see the tools unchanged.
 *
 * The resource is one self-contained HTML document, bundled from `app/view/` at `npm run build`
 * (packages/server/scripts/build-run-view.mjs) into `dist/app/run-view.html`. Its CSP `_meta` declares no
 * connect, resource or frame domains: the view loads nothing and talks to nothing but its host, and it follows
 * the run only through the host bridge (`tools/call` of observe/cancel with the run's observation token).
 */
import { readFileSync } from "node:fs";
import { RESOURCE_MIME_TYPE, RESOURCE_URI_META_KEY } from "@modelcontextprotocol/ext-apps/server";
import type { ReadResourceResult, Resource } from "@modelcontextprotocol/server";

export const RUN_VIEW_URI = "ui://webcodex/run";
export { RESOURCE_MIME_TYPE as RUN_VIEW_MIME_TYPE };

/** Where `npm run build` writes the bundled view: the package's dist/app/ (the same URL from src/app/ and dist/app/). */
export const RUN_VIEW_FILE = new URL("../../dist/app/run-view.html", import.meta.url);

/**
 * The extension's resource `_meta.ui`: empty CSP domain lists (nothing but the inline document itself; hosts
 * deny every origin not listed), no device permissions, a border around the view.
 */
const RUN_VIEW_UI_META = {
  csp: { connectDomains: [], resourceDomains: [], frameDomains: [], baseUriDomains: [] },
  permissions: {},
  prefersBorder: true,
} as const;

export const RUN_VIEW_RESOURCE: Resource = {
  uri: RUN_VIEW_URI,
  name: "run-view",
  title: "Coding agent run",
  description:
    "MCP App (io.modelcontextprotocol/ui): a live view of one coding agent run — state, agent messages, tool steps, " +
    "changed files, token usage — with Cancel. Rendered by hosts with app support beside start/observe results.",
  mimeType: RESOURCE_MIME_TYPE,
  _meta: { ui: RUN_VIEW_UI_META },
};

/** The tools/list `_meta` of a tool the run view renders. */
export function runViewToolMeta(): Record<string, unknown> {
  return { ui: { resourceUri: RUN_VIEW_URI }, [RESOURCE_URI_META_KEY]: RUN_VIEW_URI };
}

let cached: string | null = null;

/**
 * resources/read of the view. Throws when the bundle is missing (a Server run from a build that skipped the
 * view step); the caller answers with an error that says so, and nothing else changes.
 */
export function readRunViewResource(): ReadResourceResult {
  if (cached === null) {
    try {
      cached = readFileSync(RUN_VIEW_FILE, "utf8");
    } catch {
      throw new RunViewMissingError();
    }
  }
  return {
    contents: [{ uri: RUN_VIEW_URI, mimeType: RESOURCE_MIME_TYPE, text: cached, _meta: { ui: RUN_VIEW_UI_META } }],
  };
}

export class RunViewMissingError extends Error {
  constructor() {
    super(`The run view (${RUN_VIEW_URI}) is not built on this Server: run \`npm run build\` and restart it.`);
    this.name = "RunViewMissingError";
  }
}
