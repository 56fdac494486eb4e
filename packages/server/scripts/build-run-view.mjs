#!/usr/bin/env node
/**
 * Bundles the run view (src/app/view/: the MCP App, design §15) into one self-contained HTML document,
 * dist/app/run-view.html, which the Server serves as the resource ui://webcodex/run. The page script
 * (main.ts with the ext-apps App client and everything it imports) and the stylesheet are inlined; the
 * result references no other file, font or image, so nothing is fetched when a host renders it.
 * Run by `npm run build` after `tsc -b` (which type-checks the view); exits non-zero on any failure.
 */
import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const PKG = join(dirname(fileURLToPath(import.meta.url)), "..");
const SRC = join(PKG, "src", "app", "view");
const OUT = join(PKG, "dist", "app", "run-view.html");
/** Browsers the bundle targets: what current hosts (ChatGPT, Claude, VS Code webviews) run. */
const TARGET = ["chrome120", "firefox120", "safari17"];

const bundle = await build({
  entryPoints: [join(SRC, "main.ts")],
  bundle: true,
  write: false,
  format: "iife",
  platform: "browser",
  target: TARGET,
  minify: true,
  legalComments: "none",
  charset: "utf8",
  logLevel: "warning",
});
const script = bundle.outputFiles[0].text;
const style = await readFile(join(SRC, "style.css"), "utf8");
const template = await readFile(join(SRC, "index.html"), "utf8");

// The script and style go inside <script>/<style>: a closing tag in them would end the element early.
if (/<\/script/i.test(script)) throw new Error("run view bundle contains </script");
if (/<\/style/i.test(style)) throw new Error("run view stylesheet contains </style");
const html = template.replace("/*__STYLE__*/", () => style).replace("/*__SCRIPT__*/", () => script);
if (html.includes("/*__STYLE__*/") || html.includes("/*__SCRIPT__*/"))
  throw new Error("run view template placeholders left");
// Self-contained: no element may load anything (src/href attributes, CSS url(), @import).
if (/<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=/i.test(html) || /url\(|@import/i.test(style))
  throw new Error("run view must not reference external resources");

await mkdir(dirname(OUT), { recursive: true });
const tmp = `${OUT}.${process.pid}.tmp`;
await writeFile(tmp, html);
await rename(tmp, OUT);
