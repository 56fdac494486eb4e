/**
 * Parsing of `webcodex session …` (Workflow Sessions, design §11): one
 * subcommand per Server tool.
 */
import type { ParseArgsConfig } from "node:util";
import { SUBCOMMAND_GLOBAL, type SubcommandGlobals, subcommandFamily } from "./subcommand-args.js";

export const SESSION_USAGE = `Workflow sessions (provenance and handoff; they grant no authority):
  webcodex session create --project ID --title T
  webcodex session update SESSION_ID [--handoff TEXT] [--goal TEXT] [--expected-version N]   (TEXT "-" reads stdin)
  webcodex session show SESSION_ID [--after SEQ]
Use with runs: webcodex run --session SESSION_ID (record) / --context-session SESSION_ID (start from its handoff).
`;

export type SessionAction =
  | { action: "create"; project: string; title: string }
  | {
      action: "update";
      sessionId: string;
      handoff: string | undefined;
      goal: string | undefined;
      expectedVersion: number | undefined;
    }
  | { action: "show"; sessionId: string; after: number | undefined };

const OPTIONS = {
  create: { ...SUBCOMMAND_GLOBAL, project: { type: "string" }, title: { type: "string" } },
  update: {
    ...SUBCOMMAND_GLOBAL,
    handoff: { type: "string" },
    goal: { type: "string" },
    "expected-version": { type: "string" },
  },
  show: { ...SUBCOMMAND_GLOBAL, after: { type: "string" } },
} as const satisfies Record<SessionAction["action"], ParseArgsConfig["options"]>;

const args = subcommandFamily("session");

/** `null` means: print the session usage. */
export function parseSessionCommand(argv: string[]): { global: SubcommandGlobals; session: SessionAction } | null {
  const cmd = args.parse(argv, OPTIONS);
  if (cmd === null) return null;
  const { name, values: v, positionals: p, global } = cmd;
  const one = (what: string) => args.one(p, what);
  const usage = args.usage;
  switch (name) {
    case "create": {
      if (p.length > 0) throw usage("session create takes no positional arguments");
      const project = args.required(v.project, "--project ID");
      return { global, session: { action: "create", project, title: args.required(v.title, "--title T") } };
    }
    case "update": {
      const sessionId = one("SESSION_ID");
      if (v.handoff === undefined && v.goal === undefined) throw usage("give --handoff, --goal or both");
      if (v.handoff === "-" && v.goal === "-") throw usage("only one of --handoff and --goal can read stdin");
      return {
        global,
        session: {
          action: "update",
          sessionId,
          handoff: v.handoff,
          goal: v.goal,
          expectedVersion: args.wholeNumber(v["expected-version"], "--expected-version", 1),
        },
      };
    }
    case "show":
      return {
        global,
        session: { action: "show", sessionId: one("SESSION_ID"), after: args.wholeNumber(v.after, "--after", 0) },
      };
    default: {
      const never: never = name;
      return never;
    }
  }
}
