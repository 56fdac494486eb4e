/**
 * The consent and error pages: server-rendered HTML, no JavaScript, no
 * third-party assets, readable on a phone. Every value from a client (name,
 * redirect host, client id) is HTML-escaped. The page's headers forbid
 * framing and anything but its own nonce'd stylesheet (`pageHeaders`).
 */
import { randomBytes } from "node:crypto";
import type { ServerResponse } from "node:http";
import { CODING_AGENT_RUN, OAUTH_SCOPES, OPERATOR_READ_SCOPE, SCOPE_LABELS } from "./scopes.js";

export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

const STYLE = `
body{font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;background:#f6f7f9;color:#1b1f24}
main{max-width:32rem;margin:0 auto;padding:1.25rem}
h1{font-size:1.35rem;margin:.25rem 0 1rem}
.card{background:#fff;border:1px solid #d8dde3;border-radius:10px;padding:1rem 1.1rem;margin-bottom:1rem}
.muted{color:#57606a;font-size:.9rem}
code{font-size:.85rem;background:#eef1f4;padding:.05rem .3rem;border-radius:4px;word-break:break-all}
ul{padding-left:1.1rem;margin:.4rem 0}
li{margin:.35rem 0}
label{display:block;font-weight:600;margin:.6rem 0 .25rem}
input[type=password]{width:100%;box-sizing:border-box;font:inherit;padding:.6rem;border:1px solid #aab3bd;border-radius:8px}
.risk{border:1px solid #d4a72c;background:#fff8e1;border-radius:8px;padding:.7rem;margin:.8rem 0}
.risk label{font-weight:400;margin:0;display:flex;gap:.55rem;align-items:flex-start}
.risk input{margin-top:.3rem;transform:scale(1.2)}
.error{border:1px solid #cf222e;background:#ffebe9;border-radius:8px;padding:.6rem .8rem;margin-bottom:1rem}
.buttons{display:flex;gap:.75rem;margin-top:1rem}
button{font:inherit;font-weight:600;padding:.65rem 1.2rem;border-radius:8px;border:1px solid #1f6feb;cursor:pointer;flex:1}
button.allow{background:#1f6feb;color:#fff}
button.deny{background:#fff;color:#1b1f24;border-color:#aab3bd}
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

function document(title: string, nonce: string, body: string): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>${escapeHtml(title)}</title>
<style nonce="${nonce}">${STYLE}</style></head>
<body><main>${body}</main></body></html>`;
}

export interface ConsentView {
  requestId: string;
  csrf: string;
  clientId: string;
  clientName: string | null;
  /** "dynamic" names are self-asserted; the page says so. */
  clientKind: "dynamic" | "cimd" | "operator";
  redirectUri: string;
  requested: readonly string[];
  /** The operator provisioned this client for coding_agent:run. */
  codingAgentRunOffered: boolean;
  /** The operator provisioned this client for operator:read (operator-read.ts); otherwise it is not listed. */
  operatorReadOffered?: boolean;
  error?: string | undefined;
}

/** The consent page. */
export function renderConsent(res: ServerResponse, view: ConsentView, status = 200): void {
  const nonce = randomBytes(16).toString("base64");
  pageHeaders(res, nonce, formTargetOf(view.redirectUri));
  const name = view.clientName ?? view.clientId;
  let redirectHost = view.redirectUri;
  try {
    const u = new URL(view.redirectUri);
    redirectHost = u.host || u.protocol;
  } catch {
    // shown as given (already validated by the caller)
  }
  const ordinary = OAUTH_SCOPES.filter(
    (s) =>
      s !== CODING_AGENT_RUN && view.requested.includes(s) && (s !== OPERATOR_READ_SCOPE || view.operatorReadOffered),
  );
  const asksRun = view.requested.includes(CODING_AGENT_RUN);
  const scopeItems = ordinary.map((s) => `<li><code>${s}</code> — ${escapeHtml(SCOPE_LABELS[s])}</li>`).join("");
  const identity =
    view.clientKind === "dynamic"
      ? `<p class="muted">The app chose this name itself when it registered; check the address it returns to.</p>`
      : view.clientKind === "cimd"
        ? `<p class="muted">Client id: <code>${escapeHtml(view.clientId)}</code></p>`
        : `<p class="muted">Registered by your operator.</p>`;
  let runLine = "";
  if (asksRun && view.codingAgentRunOffered) {
    runLine = `<div class="risk"><label><input type="checkbox" name="coding_agent_run" value="yes">
<span><strong>Also let it run coding agents</strong> (<code>coding_agent:run</code>).
${escapeHtml(SCOPE_LABELS[CODING_AGENT_RUN])}</span></label></div>`;
  } else if (asksRun) {
    runLine = `<p class="muted">It also asked to run coding agents (<code>coding_agent:run</code>). Your operator has not
allowed this app to, so that is not offered.</p>`;
  }
  const body = `
<h1>Connect ${escapeHtml(name)} to WebCodex</h1>
${view.error ? `<div class="error" role="alert">${escapeHtml(view.error)}</div>` : ""}
<div class="card">
<p><strong>${escapeHtml(name)}</strong> will return to <strong>${escapeHtml(redirectHost)}</strong>.</p>
${identity}
${scopeItems ? `<p>It asks to:</p><ul>${scopeItems}</ul>` : ""}
</div>
<form class="card" method="post" action="/oauth/consent">
<input type="hidden" name="request_id" value="${escapeHtml(view.requestId)}">
<input type="hidden" name="csrf" value="${escapeHtml(view.csrf)}">
${runLine}
<label for="key">Your access key</label>
<input id="key" type="password" name="key" autocomplete="off" autocapitalize="off" spellcheck="false">
<p class="muted">The key your operator issued for you (keys from <code>webcodex-server token issue</code> work).
Only what your key allows can be granted.</p>
<div class="buttons">
<button class="deny" type="submit" name="action" value="deny">Deny</button>
<button class="allow" type="submit" name="action" value="approve">Allow</button>
</div>
</form>`;
  res.statusCode = status;
  res.end(document(`Connect ${name} to WebCodex`, nonce, body));
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
