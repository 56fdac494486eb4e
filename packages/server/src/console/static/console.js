// The operator console's page script (served as /console/console.js; the CSP allows no other script).
// It follows /console/events (server-sent events) and renders every value with textContent: data from
// Runners, agents and OAuth clients is never parsed as HTML.

const csrf = document.querySelector('meta[name="webcodex-csrf"]').getAttribute("content");
const FILTER_KEYS = ["state", "project", "principal", "run"];
let source = null;
/** How long to wait before opening a refused stream again (the Server caps streams per principal). */
const STREAM_RETRY_MS = 5000;

function el(tag, text, className) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (className) e.className = className;
  return e;
}

function when(iso) {
  if (!iso) return "never";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  const secs = Math.max(0, Math.round((Date.now() - d.getTime()) / 1000));
  const ago =
    secs < 90 ? `${secs}s ago` : secs < 5400 ? `${Math.round(secs / 60)} min ago` : `${Math.round(secs / 3600)} h ago`;
  return `${d.toISOString().replace("T", " ").slice(0, 19)} (${ago})`;
}

function filters() {
  const params = new URLSearchParams(location.search);
  const out = new URLSearchParams();
  for (const k of FILTER_KEYS) {
    const v = params.get(k);
    if (v) out.set(k, v);
  }
  return out;
}

function setFilters(next) {
  const q = next.toString();
  history.replaceState(null, "", q ? `/console?${q}` : "/console");
  connect();
}

function fillRows(tableId, rows, cells) {
  const body = document.querySelector(`#${tableId} tbody`);
  const out = [];
  for (const r of rows) {
    const tr = document.createElement("tr");
    for (const c of cells(r, tr)) {
      const td = document.createElement("td");
      if (c instanceof Node) td.append(c);
      else td.textContent = c === null || c === undefined ? "-" : String(c);
      tr.append(td);
    }
    out.push(tr);
  }
  if (out.length === 0) {
    const tr = document.createElement("tr");
    const td = el("td", "nothing yet", "muted");
    td.colSpan = document.querySelectorAll(`#${tableId} thead th`).length;
    tr.append(td);
    out.push(tr);
  }
  body.replaceChildren(...out);
}

function renderRunners(runners) {
  const box = document.getElementById("runners");
  const cards = runners.map((r) => {
    const card = el("article", null, `card runner ${r.online ? "online" : "offline"}`);
    card.dataset.runner = r.runner_id;
    const head = el("h3");
    head.append(el("span", r.runner_id), el("span", r.online ? "online" : "offline", "badge"));
    card.append(head);
    const dl = document.createElement("dl");
    const add = (k, v) => dl.append(el("dt", k), el("dd", v));
    if (r.since === null) add("Offline", "never connected to this Server");
    else add(r.online ? "Online since" : "Offline since", when(r.since));
    add("Runs in use", `${r.runs_in_use} of ${r.max_concurrent_runs ?? "?"}`);
    add("Projects", r.projects.map((p) => p.project_id + (p.allow_patch ? "" : " (read-only)")).join(", ") || "-");
    add("Providers", r.providers.map((p) => `${p.name} (${p.provider_id})`).join(", ") || "-");
    add("Version", r.runner_version ?? "-");
    add("Protocol", r.protocol_version ?? "-");
    add(
      "Agents share its user",
      r.agents_share_runner_user === null ? "not stated" : r.agents_share_runner_user ? "yes" : "no",
    );
    add(
      "Last refusal",
      r.last_refusal ? `${r.last_refusal.event} ×${r.last_refusal.count}, ${when(r.last_refusal.at)}` : "none",
    );
    card.append(dl);
    return card;
  });
  if (cards.length === 0) cards.push(el("p", "No Runners are configured.", "muted"));
  box.replaceChildren(...cards);
}

const counts = new Intl.NumberFormat("en-US", { notation: "compact", maximumFractionDigits: 1 });

/** A cost amount and its currency code (numbers and a code only; no run text reaches these cells). */
function costText(amount, currency) {
  return `${amount < 1 ? amount.toFixed(4) : amount.toFixed(2)}${currency ? ` ${currency}` : ""}`;
}

/** A run's usage: "context 1.2K/200K · 0.0042 USD", or null (shown as "-"). */
function usageText(u) {
  if (!u) return null;
  const parts = [];
  if (u.used_tokens !== null) {
    parts.push(
      `context ${counts.format(u.used_tokens)}${u.context_size !== null ? `/${counts.format(u.context_size)}` : ""}`,
    );
  }
  if (u.cost_amount !== null) parts.push(costText(u.cost_amount, u.cost_currency));
  return parts.length > 0 ? parts.join(" · ") : null;
}

function renderRuns(snap) {
  const selected = snap.filters.run;
  fillRows("runs", snap.runs, (r, tr) => {
    tr.dataset.run = r.run_id;
    tr.dataset.state = r.state;
    if (r.run_id === selected) tr.className = "selected";
    const link = el("button", r.run_id, "link");
    link.type = "button";
    link.addEventListener("click", () => {
      const f = filters();
      if (f.get("run") === r.run_id) f.delete("run");
      else f.set("run", r.run_id);
      setFilters(f);
    });
    const state = el("span", r.state, `state state-${r.state}`);
    const detail = [r.stop_reason, r.failure_kind].filter(Boolean).join(", ");
    const stateCell = document.createElement("span");
    stateCell.append(state);
    if (detail) stateCell.append(el("span", ` ${detail}`, "muted"));
    return [
      link,
      stateCell,
      r.project_id,
      r.provider_id,
      r.principal_id,
      r.runner_id,
      when(r.created_at),
      when(r.updated_at),
      usageText(r.usage),
    ];
  });
  const box = document.getElementById("run-events");
  if (!snap.run_events) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  const runEvents = snap.run_events;
  document.getElementById("run-events-title").textContent = `Events of ${runEvents.run_id}`;
  // The run's outcome, as `webcodex observe` prints it: state · stop reason · failure kind, then the message.
  const outcome = runEvents.outcome;
  const outcomeBox = document.getElementById("run-events-outcome");
  if (outcome) {
    const line = el("span", null);
    line.append(el("span", outcome.state, `state state-${outcome.state}`));
    const detail = [outcome.stop_reason && `stop reason ${outcome.stop_reason}`, outcome.failure_kind]
      .filter(Boolean)
      .join(" · ");
    if (detail) line.append(el("span", ` · ${detail}`, "muted"));
    outcomeBox.replaceChildren(line);
    if (outcome.message) outcomeBox.append(el("span", ` — ${outcome.message}`));
  } else {
    outcomeBox.replaceChildren(el("span", "No record of this run in the state database.", "muted"));
  }
  renderChain(runEvents);
  renderChanges(runEvents.changes);
  const lost = runEvents.history_lost
    ? runEvents.events.length > 0
      ? "Earlier events of this run are no longer available: the Runner restarted or no longer keeps them. "
      : "This run's events are no longer available: the Runner restarted or no longer keeps them. "
    : "";
  document.getElementById("run-events-note").textContent = runEvents.held
    ? `${lost}Newest events this Server holds. Agent text is shown by length only.`
    : "This Server holds no events of this run (nobody observed it here since it started, or they were evicted).";
  const items = snap.run_events.events.map((e) => {
    const li = el("li", null, `event event-${e.kind}`);
    li.append(el("span", `#${e.seq}`, "seq"), el("span", e.kind, "kind"), el("span", e.summary, "summary"));
    return li;
  });
  document.getElementById("run-events-list").replaceChildren(...items);
}

/** A button that selects another run (a link of the chain), as clicking its row does. */
function runLink(runId) {
  const b = el("button", runId, "link");
  b.type = "button";
  b.dataset.run = runId;
  b.addEventListener("click", () => {
    const f = filters();
    f.set("run", runId);
    setFilters(f);
  });
  return b;
}

/** The selected run's place in its conversation (design §17): the run it continues and the run that continued it. */
function renderChain(runEvents) {
  const box = document.getElementById("run-chain");
  const parts = [];
  if (runEvents.parent_run_id) {
    const p = el("span", null, "chain-parent");
    p.append(el("span", "Continues "), runLink(runEvents.parent_run_id));
    parts.push(p);
  }
  if (runEvents.continued_by) {
    const c = el("span", null, "chain-child");
    c.append(el("span", `${parts.length > 0 ? " · " : ""}Continued by `), runLink(runEvents.continued_by));
    parts.push(c);
  }
  box.hidden = parts.length === 0;
  box.replaceChildren(...parts);
}

/** A worktree run's changed files with counts (never the diff: that is for the run's owner, in the run view). */
function renderChanges(changes) {
  const box = document.getElementById("run-changes");
  box.hidden = !changes;
  if (!changes) return;
  const note = document.getElementById("run-changes-note");
  const head = changes.head_commit ? ` → ${changes.head_commit.slice(0, 12)}` : "";
  note.textContent =
    `Branch ${changes.branch}, base ${changes.base_commit.slice(0, 12)}${head}. ` +
    (changes.unavailable
      ? `Files not listed: ${changes.unavailable}`
      : changes.recorded
        ? `${changes.files.length} file(s)${changes.files_truncated ? ", more not listed" : ""}. The diff is shown to the run's owner only.`
        : "Not recorded yet: the run has not ended.");
  fillRows("run-changes-files", changes.files, (f) => [
    f.status,
    f.old_path ? `${f.old_path} → ${f.path}` : f.path,
    f.binary ? "binary" : f.insertions,
    f.binary ? "" : f.deletions,
  ]);
}

async function redeliver(eventId, button) {
  button.disabled = true;
  const res = await fetch("/console/webhooks/redeliver", {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({ csrf, event_id: eventId }).toString(),
  });
  if (!res.ok) {
    const body = await res.json().catch(() => ({ error: `HTTP ${res.status}` }));
    button.disabled = false;
    window.alert(`Not redelivered: ${body.error}`);
  } else {
    button.textContent = "due again";
  }
}

function renderWebhooks(webhooks) {
  fillRows("webhook-subs", webhooks.subscriptions, (w, tr) => {
    tr.dataset.subscription = w.subscription_id;
    tr.dataset.status = w.status;
    return [
      w.subscription_id,
      w.principal_id,
      w.host,
      w.event_types.join(" "),
      w.status,
      w.consecutive_failures,
      w.pending,
      w.delivered,
      w.dead,
    ];
  });
  fillRows("dead-letters", webhooks.dead_letters, (d, tr) => {
    tr.dataset.event = d.event_id;
    const b = el("button", "Redeliver", "danger");
    b.type = "button";
    b.addEventListener("click", () => void redeliver(d.event_id, b));
    const error = d.last_error ?? (d.last_status === null ? null : `HTTP ${d.last_status}`);
    return [d.event_id, d.subscription_id, d.event_type, d.run_id, d.state, d.attempts, error, when(d.created_at), b];
  });
}

async function revoke(grantId, button) {
  if (!window.confirm(`Revoke grant ${grantId}? Every token issued under it stops working at once.`)) return;
  button.disabled = true;
  const res = await fetch("/console/grants/revoke", {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({ csrf, grant_id: grantId }).toString(),
  });
  if (!res.ok) {
    const body = await res.json().catch(() => ({ error: `HTTP ${res.status}` }));
    button.disabled = false;
    button.textContent = "Revoke";
    window.alert(`Not revoked: ${body.error}`);
  } else {
    button.textContent = "revoked";
  }
}

function renderOAuth(oauth) {
  fillRows("grants", oauth.grants, (g, tr) => {
    tr.dataset.grant = g.grant_id;
    let action = "";
    if (g.revoked_at === null) {
      const b = el("button", "Revoke", "danger");
      b.type = "button";
      b.addEventListener("click", () => void revoke(g.grant_id, b));
      action = b;
    }
    const status = g.revoked_at ? `revoked ${when(g.revoked_at)} (${g.revoked_reason ?? "?"})` : "active";
    return [g.grant_id, g.client_id, g.principal_id, g.scopes.join(" "), when(g.created_at), status, action];
  });
  fillRows("clients", oauth.clients, (c) => {
    const prov = [c.coding_agent_run ? "coding_agent:run" : "", c.operator_read ? "operator:read" : ""].filter(Boolean);
    return [
      c.client_id,
      c.kind,
      c.client_name,
      prov.join(", ") || "-",
      when(c.created_at),
      c.revoked_at ? "revoked" : "active",
    ];
  });
}

function render(snap) {
  renderRunners(snap.runners);
  renderRuns(snap);
  fillRows("costs", snap.costs, (r) => [r.day, r.principal_id, costText(r.amount, r.currency), r.runs]);
  fillRows("refusals", snap.refusals, (r) => [when(r.at), r.source, r.who, r.what, r.outcome]);
  renderOAuth(snap.oauth);
  renderWebhooks(snap.webhooks);
  fillRows("audit-mcp", snap.audit.mcp, (r) => [when(r.at), r.principal_id, r.tool, r.run_id, r.outcome, r.ms]);
  fillRows("audit-link", snap.audit.link, (r) => [when(r.at), r.runner_id, r.event, r.count, r.remote]);
  fillRows("audit-oauth", snap.audit.oauth, (r) => [
    when(r.at),
    r.event,
    r.client_id,
    r.principal_id,
    r.grant_id,
    r.detail,
  ]);
}

function live(state, text) {
  const badge = document.getElementById("live");
  badge.dataset.state = state;
  badge.textContent = text;
}

function connect() {
  if (source) source.close();
  const q = filters().toString();
  source = new EventSource(q ? `/console/events?${q}` : "/console/events");
  source.addEventListener("open", () => live("live", "live"));
  source.addEventListener("snapshot", (ev) => {
    live("live", "live");
    render(JSON.parse(ev.data));
  });
  source.addEventListener("signed_out", () => {
    source.close();
    location.assign("/console/login");
  });
  source.addEventListener("error", () => {
    if (source.readyState !== EventSource.CLOSED) {
      live("retrying", "reconnecting…");
      return;
    }
    void explainClosed(q);
  });
}

/** The stream was refused (not a dropped connection): ask the snapshot route why, then act on it. */
async function explainClosed(q) {
  const res = await fetch(q ? `/console/api/snapshot?${q}` : "/console/api/snapshot", { credentials: "same-origin" });
  if (res.status === 401) {
    location.assign("/console/login");
    return;
  }
  if (!res.ok) {
    const body = await res.json().catch(() => ({ error: `HTTP ${res.status}` }));
    live("error", body.error);
    return;
  }
  // The snapshot answers but the stream did not (too many open streams): show it once, retry later.
  render(await res.json());
  live("retrying", "too many console tabs open; retrying…");
  setTimeout(connect, STREAM_RETRY_MS);
}

const form = document.getElementById("filters");
const current = filters();
for (const k of ["state", "project", "principal"]) form.elements[k].value = current.get(k) ?? "";
form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  const next = new URLSearchParams();
  for (const k of ["state", "project", "principal"]) {
    const v = form.elements[k].value.trim();
    if (v) next.set(k, v);
  }
  const run = filters().get("run");
  if (run) next.set("run", run);
  setFilters(next);
});
connect();
