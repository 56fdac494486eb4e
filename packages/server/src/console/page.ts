/**
 * The console's two HTML documents. Neither has inline script or style (the CSP forbids both): the login page
 * is a plain form, and the console page is an empty frame that console.js fills from the snapshot with
 * textContent only. Server-side values (principal id, CSRF token, error text) are HTML-escaped.
 */

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function doc(title: string, body: string, head = ""): string {
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>${escapeHtml(title)}</title>
<link rel="stylesheet" href="/console/console.css">
${head}
</head>
<body>
${body}
</body>
</html>
`;
}

export function renderLogin(loginCsrf: string, error?: string): string {
  return doc(
    "WebCodex console — sign in",
    `<main class="narrow">
<h1>WebCodex operator console</h1>
${error ? `<div class="error" role="alert">${escapeHtml(error)}</div>` : ""}
<form class="card" method="post" action="/console/login">
<input type="hidden" name="login_csrf" value="${escapeHtml(loginCsrf)}">
<label for="key">Operator key</label>
<input id="key" type="password" name="key" autocomplete="off" autocapitalize="off" spellcheck="false" required>
<p class="muted">A key with the <code>operator:read</code> scope:
<code>webcodex-server token issue --config FILE --principal ID --scope operator:read</code>.
It is exchanged once for a session cookie and not kept in the browser.</p>
<button type="submit">Sign in</button>
</form>
</main>`,
  );
}

export function renderPage(view: { principal: string; csrf: string }): string {
  return doc(
    "WebCodex console",
    `<header class="top">
<h1>WebCodex console</h1>
<span class="who">signed in as <strong id="principal">${escapeHtml(view.principal)}</strong></span>
<span id="live" class="live" data-state="connecting">connecting…</span>
<form method="post" action="/console/logout" class="logout">
<input type="hidden" name="csrf" value="${escapeHtml(view.csrf)}">
<button type="submit">Sign out</button>
</form>
</header>
<main>
<section id="runners-section"><h2>Runners</h2><div id="runners" class="cards"></div></section>
<section id="runs-section"><h2>Runs</h2>
<form id="filters" class="filters">
<label>State <select name="state"><option value="">any</option><option value="active">active</option>
<option>starting</option><option>running</option><option>waiting_permission</option><option>completed</option>
<option>failed</option><option>cancelled</option><option>lost</option></select></label>
<label>Project <input name="project" maxlength="128" autocomplete="off"></label>
<label>Principal <input name="principal" maxlength="128" autocomplete="off"></label>
<button type="submit">Filter</button>
</form>
<div class="scroll"><table id="runs"><thead><tr><th>Run</th><th>State</th><th>Project</th><th>Provider</th>
<th>Principal</th><th>Runner</th><th>Started</th><th>Updated</th><th>Usage</th></tr></thead><tbody></tbody></table></div>
<div id="run-events" hidden><h3 id="run-events-title"></h3><p id="run-events-outcome"></p>
<p id="run-chain" hidden></p>
<div id="run-changes" hidden><h4>Changed files</h4><p id="run-changes-note" class="muted"></p>
<div class="scroll"><table id="run-changes-files"><thead><tr><th>Status</th><th>Path</th><th>+</th><th>−</th></tr></thead>
<tbody></tbody></table></div></div>
<p id="run-events-note" class="muted"></p>
<ol id="run-events-list" class="events"></ol></div>
</section>
<section id="costs-section"><h2>Reported cost per principal and day</h2><div class="scroll"><table id="costs">
<thead><tr><th>Day (UTC)</th><th>Principal</th><th>Cost</th><th>Runs</th></tr></thead><tbody></tbody></table></div>
</section>
<section id="refusals-section"><h2>Recent refusals</h2><div class="scroll"><table id="refusals"><thead><tr>
<th>At</th><th>Source</th><th>Who</th><th>What</th><th>Outcome</th></tr></thead><tbody></tbody></table></div></section>
<section id="webhooks-section"><h2>Webhooks</h2>
<div class="scroll"><table id="webhook-subs"><thead><tr><th>Subscription</th><th>Principal</th><th>Receiver</th>
<th>Events</th><th>Status</th><th>Failures</th><th>Pending</th><th>Delivered</th><th>Dead</th></tr></thead><tbody></tbody></table></div>
<h3>Dead letters</h3><div class="scroll"><table id="dead-letters"><thead><tr><th>Event</th><th>Subscription</th><th>Type</th>
<th>Run or task</th><th>State</th><th>Attempts</th><th>Last error</th><th>Created</th><th></th></tr></thead><tbody></tbody></table></div>
</section>
<section id="oauth-section"><h2>OAuth clients and grants</h2>
<div class="scroll"><table id="grants"><thead><tr><th>Grant</th><th>Client</th><th>Principal</th><th>Scopes</th>
<th>Created</th><th>Status</th><th></th></tr></thead><tbody></tbody></table></div>
<div class="scroll"><table id="clients"><thead><tr><th>Client</th><th>Kind</th><th>Name</th><th>Provisioned for</th>
<th>Created</th><th>Status</th></tr></thead><tbody></tbody></table></div>
</section>
<section id="audit-section"><h2>Audit</h2>
<h3>MCP calls</h3><div class="scroll"><table id="audit-mcp"><thead><tr><th>At</th><th>Principal</th><th>Tool</th>
<th>Run</th><th>Outcome</th><th>ms</th></tr></thead><tbody></tbody></table></div>
<h3>Runner links</h3><div class="scroll"><table id="audit-link"><thead><tr><th>At</th><th>Runner</th><th>Event</th>
<th>Count</th><th>Remote</th></tr></thead><tbody></tbody></table></div>
<h3>OAuth</h3><div class="scroll"><table id="audit-oauth"><thead><tr><th>At</th><th>Event</th><th>Client</th>
<th>Principal</th><th>Grant</th><th>Detail</th></tr></thead><tbody></tbody></table></div>
</section>
</main>`,
    `<meta name="webcodex-csrf" content="${escapeHtml(view.csrf)}">
<script src="/console/console.js" defer></script>`,
  );
}
