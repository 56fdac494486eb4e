/**
 * `webcodex-server token issue|list|revoke` — operator management of
 * principal bearer tokens. The token is printed once on stdout; only its
 * sha256 is stored (table principal_tokens in the Server state DB).
 *
 *   webcodex-server token issue --config server.toml --principal alice \
 *       --scope coding_agent:run --scope project:write --project demo --allow-coding-agent-run
 *   webcodex-server token list --config server.toml [--principal alice]
 *   webcodex-server token revoke --config server.toml --id tok_...
 */
import { parseArgs } from "node:util";
import { loadServerConfig } from "../config.js";
import { principalLookup, TokenIssueError, TokenStore } from "../principals/tokens.js";
import { openState } from "../state/open.js";
import { commandUsage } from "./help.js";
import { onState } from "./on-state.js";

const USAGE = commandUsage("token");

/** Returns the process exit code. */
export async function runTokenCommand(argv: readonly string[]): Promise<number> {
  const [sub, ...rest] = argv;
  let values: {
    config?: string;
    principal?: string;
    scope?: string[];
    project?: string[];
    id?: string;
    json?: boolean;
    "allow-coding-agent-run"?: boolean;
  };
  try {
    ({ values } = parseArgs({
      args: [...rest],
      options: {
        config: { type: "string" },
        principal: { type: "string" },
        scope: { type: "string", multiple: true },
        project: { type: "string", multiple: true },
        id: { type: "string" },
        json: { type: "boolean" },
        "allow-coding-agent-run": { type: "boolean" },
      },
      strict: true,
    }));
  } catch (err) {
    console.error(`${err instanceof Error ? err.message : String(err)}\n${USAGE}`);
    return 2;
  }
  if (!values.config || (sub !== "issue" && sub !== "list" && sub !== "revoke")) {
    console.error(USAGE);
    return 2;
  }
  // Runner tokens play no part in principal tokens: a runner's token_env need not be set to manage them.
  const env = new Proxy(process.env, {
    get: (target, key) => (typeof key === "string" ? (target[key] ?? "unused-by-token-command") : undefined),
  });
  const config = loadServerConfig(values.config, env);
  const state = await openState(config);
  return await onState(state, { type: TokenIssueError, what: "token issue" }, async () => {
    const tokens = new TokenStore(state.engine);
    switch (sub) {
      case "issue": {
        if (!values.principal) {
          console.error(`--principal is required\n${USAGE}`);
          return 2;
        }
        const issued = await tokens.issue(
          {
            principal_id: values.principal,
            scopes: values.scope ?? [],
            projects: values.project ?? [],
            allowCodingAgentRun: values["allow-coding-agent-run"] === true,
          },
          principalLookup(config.principals),
        );
        if (values.json) {
          console.log(JSON.stringify(issued));
        } else {
          console.error(
            `issued ${issued.token_id} for ${issued.principal_id}: scopes [${issued.scopes.join(", ")}], projects [${issued.projects.join(", ")}]`,
          );
          console.error("the token is shown once; store it now:");
          console.log(issued.token);
        }
        return 0;
      }
      case "list": {
        for (const t of await tokens.list(values.principal)) {
          const status = t.revoked_at ? `revoked ${t.revoked_at}` : "active";
          console.log(
            `${t.token_id}\t${t.principal_id}\t${t.scopes.join(",")}\t${t.projects.join(",")}\t${t.created_at}\t${status}`,
          );
        }
        return 0;
      }
      case "revoke": {
        if (!values.id) {
          console.error(`--id is required\n${USAGE}`);
          return 2;
        }
        if (!(await tokens.revoke(values.id))) {
          console.error(`no active token with id ${values.id}`);
          return 1;
        }
        console.error(`revoked ${values.id}`);
        return 0;
      }
    }
  });
}
