/**
 * The consent and error pages: server-rendered HTML, no JavaScript, no
 * third-party assets, readable on a phone. Every value from a client (name,
 * redirect host, client id) is HTML-escaped. The page's headers forbid
 * framing and anything but its own nonce'd stylesheet (`pageHeaders`).
 */
import { randomBytes } from "node:crypto";
import type { ServerResponse } from "node:http";
import { CODING_AGENT_RUN, OAUTH_SCOPES, OPERATOR_READ_SCOPE, SCOPE_LABELS, WEBHOOKS_WRITE_SCOPE } from "./scopes.js";

export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/**
 * Phone-width rules: words wrap only between words (`overflow-wrap: break-word` breaks a word only
 * when it cannot fit a line on its own); `overflow-wrap: anywhere` is kept for ids, URLs and commands
 * (`.id`), which have no word boundaries. Colours follow `prefers-color-scheme`.
 */
const STYLE = `
:root{color-scheme:light dark;--bg:#f6f7f9;--fg:#1b1f24;--card:#fff;--line:#d8dde3;--muted:#57606a;--code:#eef1f4;
--accent:#1f6feb;--accent-fg:#fff;--risk-bg:#fff8e1;--risk-line:#d4a72c;--err-bg:#ffebe9;--err-line:#cf222e;--input:#aab3bd}
@media (prefers-color-scheme:dark){:root{--bg:#0d1117;--fg:#e6edf3;--card:#161b22;--line:#30363d;--muted:#9198a1;
--code:#262c36;--accent:#2f81f7;--accent-fg:#fff;--risk-bg:#2b2111;--risk-line:#9e6a03;--err-bg:#2d1214;--err-line:#f85149;--input:#3d444d}}
body{font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;background:var(--bg);color:var(--fg);
overflow-wrap:break-word;word-break:normal;hyphens:manual}
main{max-width:32rem;margin:0 auto;padding:1.25rem}
h1{font-size:1.35rem;margin:.25rem 0 1rem}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:1rem 1.1rem;margin-bottom:1rem}
.muted{color:var(--muted);font-size:.9rem}
.ops{color:var(--muted);font-size:.8rem;border-top:1px solid var(--line);margin-top:1rem;padding-top:.6rem}
code{font-size:.85rem;background:var(--code);padding:.05rem .3rem;border-radius:4px;white-space:nowrap}
.id{overflow-wrap:anywhere;white-space:normal}
ul{padding-left:1.1rem;margin:.4rem 0}
li{margin:.35rem 0}
dl{margin:.6rem 0}dt{font-weight:600;margin-top:.5rem}dd{margin:0}
label{display:block;font-weight:600;margin:.6rem 0 .25rem}
input[type=password]{width:100%;box-sizing:border-box;font:inherit;padding:.6rem;border:1px solid var(--input);
border-radius:8px;background:var(--card);color:var(--fg)}
.risk{border:1px solid var(--risk-line);background:var(--risk-bg);border-radius:8px;padding:.7rem;margin:.8rem 0}
.risk label{font-weight:400;margin:0;display:flex;gap:.55rem;align-items:flex-start}
.risk input{margin-top:.3rem;transform:scale(1.2);flex:none}
.error{border:1px solid var(--err-line);background:var(--err-bg);border-radius:8px;padding:.6rem .8rem;margin-bottom:1rem}
.buttons{display:flex;flex-direction:row-reverse;gap:.75rem;margin-top:1rem}
button,a.button{font:inherit;font-weight:600;padding:.65rem 1.2rem;border-radius:8px;border:1px solid var(--accent);
cursor:pointer;flex:1;text-align:center;text-decoration:none}
button.allow,a.button{background:var(--accent);color:var(--accent-fg)}
a.button{display:block;box-sizing:border-box}
button.deny{background:var(--card);color:var(--fg);border-color:var(--input)}
`;

/** Headers of every HTML page here. `formTarget` is where the consent form may redirect to (the client). */
export function pageHeaders(res: ServerResponse, nonce: string, formTarget: string | null): void {
  const formAction = formTarget ? `'self' ${formTarget}` : "'self'";
  res.setHeader(
    "Content-Security-Policy",
    `default-src 'none'; style-src 'nonce-${nonce}'; img-src 'none'; form-action ${formAction}; ` +
      "frame-ancestors 'none'; base-uri 'none'",
  );
  res.setHeader("X-Frame-Options", "DENY");
  res.setHeader("X-Content-Type-Options", "nosniff");
  res.setHeader("Referrer-Policy", "no-referrer");
  res.setHeader("Cache-Control", "no-store");
  res.setHeader("Content-Type", "text/html; charset=utf-8");
}

/** The CSP source a form redirect to `redirectUri` needs: its origin, or its private-use scheme. */
export function formTargetOf(redirectUri: string): string | null {
  try {
    const u = new URL(redirectUri);
    if (u.protocol === "http:" || u.protocol === "https:") return u.origin;
    return /^[a-z][a-z0-9+.-]*:$/i.test(u.protocol) ? u.protocol : null;
  } catch {
    return null;
  }
}

function document(title: string, nonce: string, body: string, head = ""): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<meta name="referrer" content="no-referrer">${head}
<title>${escapeHtml(title)}</title>
<style nonce="${nonce}">${STYLE}</style></head>
<body><main>${body}</main></body></html>`;
}

/** After Allow, the result page sends the browser back to the app this many seconds later (and has a link). */
export const RESULT_REFRESH_SECS = 3;

/** Who is asking: shown on every step. */
export interface ClientView {
  clientId: string;
  clientName: string | null;
  /** "dynamic" names are self-asserted; the page says so. */
  clientKind: "dynamic" | "cimd" | "operator";
  redirectUri: string;
}

/**
 * What the page says about `coding_agent:run` when the app asked for it:
 * - `offered`: its own unchecked line (the client is provisioned and the key carries it);
 * - `not_provisioned`: not offered; the operator line names the command that would allow it;
 * - `key_lacks`: the client may, but this key does not carry it;
 * - `none`: not asked for.
 */
export type RunLine = "offered" | "not_provisioned" | "key_lacks" | "none";

/** Step 1: the request, and the access key field. */
export interface AskView extends ClientView {
  requestId: string;
  csrf: string;
  /** Known scopes the app asked for, in page order (coding_agent:run included when asked). */
  requested: readonly string[];
  /** The client is provisioned for coding_agent:run. */
  codingAgentRunOffered: boolean;
  /** The operator provisioned this client for operator:read (operator-read.ts); otherwise it is not listed. */
  operatorReadOffered?: boolean;
  error?: string | undefined;
}

/** What a grant gives: shown before Allow (step 2) and after it (the result page). */
export interface GrantSummary {
  /** Scopes other than coding_agent:run that will be (or were) granted. */
  scopes: readonly string[];
  /** The key's projects. */
  projects: readonly string[];
  refreshTtlSecs: number;
  accessTtlSecs: number;
}

/** Step 2: exactly what Allow grants with this key. */
export interface ReviewView extends ClientView, GrantSummary {
  requestId: string;
  csrf: string;
  run: RunLine;
}

/** A whole number of days, hours or minutes, in words. */
export function durationWords(secs: number): string {
  const unit = (n: number, word: string) => `${n} ${word}${n === 1 ? "" : "s"}`;
  if (secs % 86_400 === 0) return unit(secs / 86_400, "day");
  if (secs % 3600 === 0) return unit(secs / 3600, "hour");
  return unit(Math.max(1, Math.round(secs / 60)), "minute");
}

/** A client id as one shell word (single-quoted unless plainly safe). */
function shellWord(text: string): string {
  return /^[A-Za-z0-9_.:/@-]+$/.test(text) ? text : `'${text.replaceAll("'", `'\\''`)}'`;
}

function nameOf(view: ClientView): string {
  return view.clientName ?? view.clientId;
}

function returnHost(redirectUri: string): string {
  try {
    const u = new URL(redirectUri);
    return u.host || u.protocol;
  } catch {
    return redirectUri;
  }
}

function identityLine(view: ClientView): string {
  switch (view.clientKind) {
    case "dynamic":
      return `<p class="muted">The app chose this name itself; check that the address it returns to is the one you expect.</p>`;
    case "cimd":
      return `<p class="muted">App id: <code class="id">${escapeHtml(view.clientId)}</code></p>`;
    case "operator":
      return `<p class="muted">Your operator registered this app.</p>`;
  }
}

function scopeList(scopes: readonly string[]): string {
  const items = OAUTH_SCOPES.filter((s) => scopes.includes(s)).map(
    (s) => `<li>${escapeHtml(SCOPE_LABELS[s])} <code class="muted">${s}</code></li>`,
  );
  return items.length > 0 ? `<ul>${items.join("")}</ul>` : "";
}

/** The small line an operator can act on: provisioning this client for coding_agent:run. */
function provisionHint(view: ClientView): string {
  const command = `webcodex-server oauth clients allow-coding-agent-run ${shellWord(view.clientId)} --config <server config>`;
  return `<p class="ops">For operators: to let this app start coding agents, run
<code class="id">${escapeHtml(command)}</code> and then connect the app again.</p>`;
}

function runNotice(run: RunLine): string {
  if (run === "not_provisioned")
    return `<p class="muted">It also asked to start coding agents. This app is not allowed to do that here, so it does
not get that. You can pass the note at the bottom of this page to whoever runs this WebCodex.</p>`;
  if (run === "key_lacks")
    return `<p class="muted">It also asked to start coding agents. Your key does not allow that, so the app does not
get that.</p>`;
  return "";
}

function summaryList(g: GrantSummary): string {
  const projects =
    g.projects.length > 0
      ? g.projects.map((p) => `<code>${escapeHtml(p)}</code>`).join(", ")
      : "None yet: your key names no project, so the app can do nothing there until your operator adds one.";
  return `<dl>
<dt>In these projects</dt><dd>${projects}</dd>
<dt>For how long</dt><dd>As long as the app uses the connection at least once every ${durationWords(g.refreshTtlSecs)}
(each access it gets lasts ${durationWords(g.accessTtlSecs)}). Your operator can end it at any time.</dd>
</dl>`;
}

function hidden(requestId: string, csrf: string): string {
  return `<input type="hidden" name="request_id" value="${escapeHtml(requestId)}">
<input type="hidden" name="csrf" value="${escapeHtml(csrf)}">`;
}

/** Step 1 of the consent page: who asks, for what, and the access key. */
export function renderConsent(res: ServerResponse, view: AskView, status = 200): void {
  const nonce = randomBytes(16).toString("base64");
  pageHeaders(res, nonce, formTargetOf(view.redirectUri));
  const name = nameOf(view);
  const asksRun = view.requested.includes(CODING_AGENT_RUN);
  // operator:read is listed only for a client the operator provisioned for it (operator-read.ts), webhooks:write
  // only for one provisioned for coding_agent:run.
  const ordinary = view.requested.filter(
    (s) =>
      s !== CODING_AGENT_RUN &&
      (s !== OPERATOR_READ_SCOPE || view.operatorReadOffered === true) &&
      (s !== WEBHOOKS_WRITE_SCOPE || view.codingAgentRunOffered),
  );
  const runAsk =
    asksRun && view.codingAgentRunOffered
      ? `<p class="muted">It also asks to start coding agents; you choose that separately on the next step.</p>`
      : "";
  const body = `
<h1>Connect ${escapeHtml(name)} to WebCodex</h1>
${view.error ? `<div class="error" role="alert">${escapeHtml(view.error)}</div>` : ""}
<div class="card">
<p><strong>${escapeHtml(name)}</strong> will return you to <strong class="id">${escapeHtml(returnHost(view.redirectUri))}</strong>.</p>
${identityLine(view)}
${ordinary.length > 0 ? `<p>It asks to:</p>${scopeList(ordinary)}` : ""}
${runAsk}${asksRun && !view.codingAgentRunOffered ? runNotice("not_provisioned") : ""}
</div>
<form class="card" method="post" action="/oauth/consent">
${hidden(view.requestId, view.csrf)}
<label for="key">Your access key</label>
<input id="key" type="password" name="key" autocomplete="off" autocapitalize="off" spellcheck="false">
<p class="muted">The key you were given for WebCodex. Next you see exactly what the app would get with it; nothing is
allowed until you choose Allow.</p>
<div class="buttons">
<button class="allow" type="submit" name="action" value="review">Continue</button>
<button class="deny" type="submit" name="action" value="deny">Deny</button>
</div>
<p class="ops">For operators: access keys come from <code>webcodex-server token issue</code>.</p>
${asksRun && !view.codingAgentRunOffered ? provisionHint(view) : ""}
</form>`;
  res.statusCode = status;
  res.end(document(`Connect ${name} to WebCodex`, nonce, body));
}

/** Step 2: exactly what Allow grants with the key just typed. */
export function renderReview(res: ServerResponse, view: ReviewView): void {
  const nonce = randomBytes(16).toString("base64");
  pageHeaders(res, nonce, formTargetOf(view.redirectUri));
  const name = nameOf(view);
  const nothing = view.scopes.length === 0 && view.run !== "offered";
  const runLine =
    view.run === "offered"
      ? `<div class="risk"><label><input type="checkbox" name="coding_agent_run" value="yes">
<span><strong>Also let it start coding agents</strong> <code class="muted">${CODING_AGENT_RUN}</code><br>
${escapeHtml(SCOPE_LABELS[CODING_AGENT_RUN])} Leave this unticked unless you want that.</span></label></div>`
      : runNotice(view.run);
  const grants = nothing
    ? `<div class="error" role="alert">Your key does not allow anything this app asks for, so there is nothing to
allow. Deny, or ask your operator for a key that fits.</div>`
    : `<p>With your key, <strong>${escapeHtml(name)}</strong> will be able to:</p>${scopeList(view.scopes)}
${runLine}${summaryList(view)}`;
  const body = `
<h1>Allow ${escapeHtml(name)} to use WebCodex?</h1>
<form method="post" action="/oauth/consent">
${hidden(view.requestId, view.csrf)}
<div class="card">
${grants}
<p class="muted">Afterwards you return to <strong class="id">${escapeHtml(returnHost(view.redirectUri))}</strong>.</p>
</div>
<div class="buttons">
${nothing ? "" : `<button class="allow" type="submit" name="action" value="approve">Allow</button>`}
<button class="deny" type="submit" name="action" value="deny">Deny</button>
</div>
${view.run === "not_provisioned" ? provisionHint(view) : ""}
</form>`;
  res.statusCode = 200;
  res.end(document(`Allow ${name} to use WebCodex?`, nonce, body));
}

/** After Allow: what was granted, and the way back to the app (a link, and a refresh after RESULT_REFRESH_SECS). */
export function renderResult(
  res: ServerResponse,
  view: ClientView & GrantSummary & { codingAgentRun: boolean; run: RunLine; continueUrl: string },
): void {
  const nonce = randomBytes(16).toString("base64");
  pageHeaders(res, nonce, null);
  const name = nameOf(view);
  const granted = view.codingAgentRun ? [...view.scopes, CODING_AGENT_RUN] : view.scopes;
  const back = escapeHtml(view.continueUrl);
  const body = `
<h1>${escapeHtml(name)} is connected</h1>
<div class="card">
<p><strong>${escapeHtml(name)}</strong> can now:</p>${scopeList(granted)}
${view.codingAgentRun ? "" : runNotice(view.run)}${summaryList(view)}
${view.run === "not_provisioned" ? provisionHint(view) : ""}
</div>
<p><a class="button" id="continue" href="${back}">Return to ${escapeHtml(name)}</a></p>
<p class="muted">Taking you back to <span class="id">${escapeHtml(returnHost(view.redirectUri))}</span> in a moment.</p>`;
  res.statusCode = 200;
  res.end(
    document(
      `${name} is connected`,
      nonce,
      body,
      `\n<meta http-equiv="refresh" content="${RESULT_REFRESH_SECS};url=${back}">`,
    ),
  );
}

/** A page for errors that cannot go back to the client (its redirect cannot be trusted). */
export function renderErrorPage(res: ServerResponse, status: number, title: string, message: string): void {
  const nonce = randomBytes(16).toString("base64");
  pageHeaders(res, nonce, null);
  res.statusCode = status;
  res.end(
    document(
      title,
      nonce,
      `<h1>${escapeHtml(title)}</h1><div class="card"><p>${escapeHtml(message)}</p>
<p class="muted">Nothing was granted. Go back to the app and start connecting again.</p></div>`,
    ),
  );
}
