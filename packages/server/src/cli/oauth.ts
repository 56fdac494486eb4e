/**
 * `webcodex-server oauth …` — operator management of OAuth clients and grants
 * (state DB tables oauth_clients / oauth_grants). Provisioning changes and
 * revocations land in the oauth_audit table. Nothing here prints a token,
 * code or key (the store holds none).
 *
 *   webcodex-server oauth clients list|show|revoke|allow-coding-agent-run|disallow-coding-agent-run [CLIENT_ID] --config F
 *   webcodex-server oauth clients allow-operator-read|disallow-operator-read CLIENT_ID --config F
 *   webcodex-server oauth grants list [--principal P] [--client C] --config F
 *   webcodex-server oauth grants revoke (--id G | --principal P | --client C) --config F
 *   webcodex-server oauth audit list [--limit N] [--json] --config F   (read-only; newest N rows, oldest first)
 */
import { parseArgs } from "node:util";
import { loadServerConfig } from "../config.js";
import { isMetadataUrl } from "../oauth/client-metadata.js";
import { OperatorReadClients } from "../oauth/operator-read.js";
import { type ClientRow, type GrantRow, OAuthStore, parseJsonList } from "../oauth/store.js";
import { openState } from "../state/open.js";
import { AUDIT_LIST_DEFAULT, AUDIT_LIST_MAX, commandUsage } from "./help.js";

export { AUDIT_LIST_DEFAULT, AUDIT_LIST_MAX };

const USAGE = commandUsage("oauth");

async function clientView(c: ClientRow, store: OAuthStore) {
  const grants = await store.grants({ client_id: c.client_id });
  return {
    client_id: c.client_id,
    kind: c.kind,
    client_name: c.client_name,
    redirect_uris: parseJsonList(c.redirect_uris),
    allow_coding_agent_run: c.allow_coding_agent_run === 1,
    allow_operator_read: await new OperatorReadClients(store).has(c.client_id),
    created_at: c.created_at,
    revoked_at: c.revoked_at,
    live_grants: grants.filter((g) => g.revoked_at === null).length,
  };
}

function grantView(g: GrantRow) {
  return {
    grant_id: g.grant_id,
    client_id: g.client_id,
    principal_id: g.principal_id,
    key_id: g.key_id,
    scopes: parseJsonList(g.scopes),
    projects: parseJsonList(g.projects),
    created_at: g.created_at,
    revoked_at: g.revoked_at,
    revoked_reason: g.revoked_reason,
  };
}

/** Returns the process exit code. */
export async function runOAuthCommand(argv: readonly string[]): Promise<number> {
  const [noun, verb, ...rest] = argv;
  let parsed: ReturnType<typeof parse>;
  function parse(args: string[]) {
    return parseArgs({
      args,
      allowPositionals: true,
      options: {
        config: { type: "string" },
        principal: { type: "string" },
        client: { type: "string" },
        id: { type: "string" },
        json: { type: "boolean" },
        limit: { type: "string" },
      },
      strict: true,
    });
  }
  try {
    parsed = parse([...rest]);
  } catch (err) {
    console.error(`${err instanceof Error ? err.message : String(err)}\n${USAGE}`);
    return 2;
  }
  const { values, positionals } = parsed;
  if (!values.config || (noun !== "clients" && noun !== "grants" && noun !== "audit")) {
    console.error(USAGE);
    return 2;
  }
  // Runner tokens play no part here: a runner's token_env need not be set to manage OAuth.
  const env = new Proxy(process.env, {
    get: (target, key) => (typeof key === "string" ? (target[key] ?? "unused-by-oauth-command") : undefined),
  });
  const config = loadServerConfig(values.config, env);
  const state = await openState(config);
  try {
    const store = new OAuthStore(state.engine);
    if (noun === "clients") return await clientsCommand(store, verb, positionals[0], values.json === true);
    if (noun === "audit") return await auditCommand(store, verb, values.limit, values.json === true);
    return await grantsCommand(store, verb, values);
  } finally {
    await state.close();
  }
}

async function clientsCommand(
  store: OAuthStore,
  verb: string | undefined,
  clientId: string | undefined,
  json: boolean,
): Promise<number> {
  if (verb === "list") {
    const rows = [];
    for (const c of await store.clients()) rows.push(await clientView(c, store));
    if (json) console.log(JSON.stringify(rows));
    else
      for (const c of rows) {
        const provisioned = [
          c.allow_coding_agent_run ? "coding_agent:run" : "",
          c.allow_operator_read ? "operator:read" : "",
        ].filter((x) => x !== "");
        const run = provisioned.length > 0 ? provisioned.join(",") : "-";
        const status = c.revoked_at ? `revoked ${c.revoked_at}` : "active";
        console.log(`${c.client_id}\t${c.kind}\t${c.client_name ?? ""}\t${run}\tgrants=${c.live_grants}\t${status}`);
      }
    return 0;
  }
  if (
    verb !== "show" &&
    verb !== "revoke" &&
    verb !== "allow-coding-agent-run" &&
    verb !== "disallow-coding-agent-run" &&
    verb !== "allow-operator-read" &&
    verb !== "disallow-operator-read"
  ) {
    console.error(USAGE);
    return 2;
  }
  if (!clientId) {
    console.error(`CLIENT_ID is required\n${USAGE}`);
    return 2;
  }
  let row = await store.client(clientId);
  if (!row && (verb === "allow-coding-agent-run" || verb === "allow-operator-read") && isMetadataUrl(clientId)) {
    // A metadata-document client that has not connected yet: record it so the flag waits for it.
    await store.upsertClient({ client_id: clientId, kind: "cimd", client_name: null, redirect_uris: [] });
    await store.markStale(clientId);
    row = await store.client(clientId);
  }
  if (!row) {
    console.error(`no OAuth client ${clientId} (see: webcodex-server oauth clients list)`);
    return 1;
  }
  switch (verb) {
    case "show":
      console.log(
        JSON.stringify(
          { ...(await clientView(row, store)), grants: (await store.grants({ client_id: clientId })).map(grantView) },
          null,
          2,
        ),
      );
      return 0;
    case "revoke":
      if (!(await store.revokeClient(clientId))) {
        console.error(`client ${clientId} is already revoked`);
        return 1;
      }
      console.error(`revoked client ${clientId} and all its grants`);
      return 0;
    case "allow-coding-agent-run":
      if (row.revoked_at) {
        console.error(`client ${clientId} is revoked`);
        return 1;
      }
      await store.setCodingAgentRun(clientId, true);
      console.error(
        `client ${clientId} may now be offered coding_agent:run on the consent page (its own, unchecked line). ` +
          "Existing grants are unchanged: the person must connect again and tick it.",
      );
      return 0;
    case "disallow-coding-agent-run":
      await store.setCodingAgentRun(clientId, false);
      console.error(`client ${clientId} no longer gets coding_agent:run; its tokens lose it from the next request`);
      return 0;
    case "allow-operator-read":
      if (row.revoked_at) {
        console.error(`client ${clientId} is revoked`);
        return 1;
      }
      await new OperatorReadClients(store).set(clientId, true);
      console.error(
        `client ${clientId} may now be offered operator:read on the consent page (only to a key that holds it). ` +
          "Existing grants are unchanged: the person must connect again.",
      );
      return 0;
    case "disallow-operator-read":
      await new OperatorReadClients(store).set(clientId, false);
      console.error(`client ${clientId} no longer gets operator:read; its tokens lose it from the next request`);
      return 0;
  }
  return 2;
}

async function grantsCommand(
  store: OAuthStore,
  verb: string | undefined,
  values: {
    principal?: string | undefined;
    client?: string | undefined;
    id?: string | undefined;
    json?: boolean | undefined;
  },
): Promise<number> {
  const filter = {
    ...(values.principal !== undefined ? { principal_id: values.principal } : {}),
    ...(values.client !== undefined ? { client_id: values.client } : {}),
  };
  if (verb === "list") {
    const rows = (await store.grants(filter)).map(grantView);
    if (values.json) console.log(JSON.stringify(rows));
    else
      for (const g of rows) {
        const status = g.revoked_at ? `revoked ${g.revoked_at} (${g.revoked_reason})` : "active";
        console.log(
          `${g.grant_id}\t${g.principal_id}\t${g.client_id}\t${g.scopes.join(",")}\t${g.created_at}\t${status}`,
        );
      }
    return 0;
  }
  if (verb !== "revoke") {
    console.error(USAGE);
    return 2;
  }
  let targets: GrantRow[];
  if (values.id !== undefined) {
    const g = await store.grant(values.id);
    targets = g ? [g] : [];
  } else if (values.principal !== undefined || values.client !== undefined) {
    targets = await store.grants(filter);
  } else {
    console.error(`one of --id, --principal or --client is required\n${USAGE}`);
    return 2;
  }
  let n = 0;
  for (const g of targets) if (await store.revokeGrant(g.grant_id, "operator")) n += 1;
  console.error(`revoked ${n} grant(s)`);
  return n > 0 || targets.length > 0 ? 0 : 1;
}

async function auditCommand(
  store: OAuthStore,
  verb: string | undefined,
  limitArg: string | undefined,
  json: boolean,
): Promise<number> {
  if (verb !== "list") {
    console.error(USAGE);
    return 2;
  }
  const limit =
    limitArg === undefined ? AUDIT_LIST_DEFAULT : /^\d{1,6}$/.test(limitArg) ? Number(limitArg) : Number.NaN;
  if (!Number.isInteger(limit) || limit < 1 || limit > AUDIT_LIST_MAX) {
    console.error(
      `--limit must be a whole number from 1 to ${AUDIT_LIST_MAX}, got ${JSON.stringify(limitArg?.slice(0, 20))}`,
    );
    return 2;
  }
  const rows = await store.auditRows(limit);
  if (json) console.log(JSON.stringify(rows));
  else
    for (const r of rows) {
      console.log(
        [
          r.at,
          r.event,
          r.client_id ?? "-",
          r.principal_id ?? "-",
          r.grant_id ?? "-",
          r.scopes ?? "-",
          r.detail ?? "-",
        ].join("\t"),
      );
    }
  return 0;
}
