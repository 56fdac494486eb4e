/**
 * Scenarios for the security tests (issue 19): an agent that tries to act on
 * the client's terminal, one that tries to read its parent's (the Runner's)
 * credentials the way a prompt-injected `cat` would, one that lists the file
 * descriptors it inherited, and one that echoes its own command line.
 */
import { createHash } from "node:crypto";
import { readdirSync, readFileSync, readlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { END_TURN, noParams, type Scenario, say, scenario, update } from "../turn.js";

const ESC = "\u001b";
const BEL = "\u0007";
const ST = `${ESC}\\`;

/** Every terminal attack the `escapes` scenario sends, by name (tests assert none survives). */
export const TERMINAL_ATTACKS = {
  osc_title: `${ESC}]0;pwned-window-title${BEL}`,
  osc_title_st: `${ESC}]2;pwned-title-st${ST}`,
  osc8_link: `${ESC}]8;;https://evil.example/${ST}click here${ESC}]8;;${ST}`,
  clear_screen: `${ESC}[2J${ESC}[3J${ESC}[H`,
  forged_completed: `${ESC}[1A${ESC}[2K\r✔ completed · stop reason end_turn\n`,
  c1_csi: "\u009b2J",
  c1_osc: "\u009d0;c1-title\u009c",
  bidi: "\u202Eexe.txt\u202C \u2066isolate\u2069",
  bell_backspace: `${BEL}\b\b\bDEL\u007f`,
} as const;

export const escapes: Scenario = scenario("escapes", noParams, async (turn) => {
  const all = Object.values(TERMINAL_ATTACKS).join("");
  for (const [name, attack] of Object.entries(TERMINAL_ATTACKS)) await say(turn, `[${name}]${attack}`);
  await update(turn, { sessionUpdate: "agent_thought_chunk", content: { type: "text", text: `thinking ${all}` } });
  await update(turn, {
    sessionUpdate: "plan",
    entries: [{ content: `step ${TERMINAL_ATTACKS.clear_screen}one`, priority: "high", status: "pending" }],
  });
  await update(turn, {
    sessionUpdate: "tool_call",
    toolCallId: `call-${ESC}[2Jesc`,
    title: `title ${TERMINAL_ATTACKS.osc_title}${TERMINAL_ATTACKS.forged_completed}`,
    kind: "edit",
    status: "in_progress",
  });
  await update(turn, {
    sessionUpdate: "tool_call_update",
    toolCallId: `call-${ESC}[2Jesc`,
    status: "completed",
    content: [
      {
        type: "diff",
        path: join(turn.session.cwd, `src${TERMINAL_ATTACKS.bidi}`, `a${ESC}]0;t${BEL}.js`),
        oldText: null,
        newText: "x\n",
      },
      { type: "terminal", terminalId: `term-${TERMINAL_ATTACKS.c1_csi}` },
    ],
  });
  await say(turn, "\nend of escapes\n");
  return END_TURN;
});

export interface AgentIdentity {
  uid: number | null;
  gid: number | null;
  groups: number[];
  cap_eff: string | null;
  cap_prm: string | null;
  cap_amb: string | null;
  cap_bnd: string | null;
  /** The `NoNewPrivs:` flag ("1" when set). */
  no_new_privs: string | null;
}

/** What reading one credential source gave: `read` (with a digest of the bytes) or the errno code. */
export interface ReadOutcome {
  outcome: string;
  sha256?: string;
}

function tryRead(path: string): { outcome: ReadOutcome; text: string | null } {
  try {
    const bytes = readFileSync(path);
    return {
      outcome: { outcome: "read", sha256: createHash("sha256").update(bytes).digest("hex") },
      text: bytes.toString("utf8"),
    };
  } catch (error) {
    return { outcome: { outcome: (error as NodeJS.ErrnoException).code ?? "error" }, text: null };
  }
}

/** Who this process is: ids, supplementary groups, capability sets (hex) and no_new_privs, from /proc/self/status. */
function identity(): AgentIdentity {
  let status = "";
  try {
    status = readFileSync("/proc/self/status", "utf8");
  } catch {
    // not Linux
  }
  const cap = (name: string) => new RegExp(`^${name}:\\s*([0-9a-f]+)$`, "m").exec(status)?.[1] ?? null;
  return {
    uid: process.getuid?.() ?? null,
    gid: process.getgid?.() ?? null,
    groups: process.getgroups?.() ?? [],
    cap_eff: cap("CapEff"),
    cap_prm: cap("CapPrm"),
    cap_amb: cap("CapAmb"),
    cap_bnd: cap("CapBnd"),
    no_new_privs: /^NoNewPrivs:\s*(\d+)$/m.exec(status)?.[1] ?? null,
  };
}

/**
 * Tries what a prompt-injected command could: the parent's environment
 * (`/proc/<ppid>/environ`, where a `token_env` token lives), its command line,
 * the `--config` file named there, the `token_file` named in that config, and
 * `file=PATH` when given. Writes a ledger `credentials` line with each
 * outcome (errno code, or `read` with a SHA-256 of the bytes — never the
 * bytes) plus who the agent is (uid, gid, groups, capability sets), and
 * says the outcomes in one message. With `leak_to=PATH` it also does what an
 * attacker would with the loot: writes the token it found (the `env_name`
 * value from the environ, else the `token_file` contents) to PATH (0600), so
 * an impersonation test can use exactly what the agent read.
 */
export const readCredentials: Scenario = scenario(
  "read_credentials file=/path/to/runner.token",
  z
    .object({
      file: z.string().min(1).optional(),
      env_name: z.string().min(1).optional(),
      leak_to: z.string().min(1).optional(),
    })
    .strict(),
  async (turn, { file, env_name, leak_to }) => {
    let loot: string | undefined;
    const ppid = process.ppid;
    const environ = tryRead(`/proc/${ppid}/environ`);
    const cmdline = tryRead(`/proc/${ppid}/cmdline`);
    const result: Record<string, ReadOutcome | boolean> = {
      environ: environ.outcome,
      cmdline: cmdline.outcome,
    };
    if (env_name !== undefined && environ.text !== null) {
      const entry = environ.text.split("\0").find((e) => e.startsWith(`${env_name}=`));
      result.environ_has_name = entry !== undefined;
      loot = entry?.slice(env_name.length + 1);
    }
    const argv = cmdline.text?.split("\0") ?? [];
    const configIndex = argv.indexOf("--config");
    const configPath = configIndex >= 0 ? argv[configIndex + 1] : undefined;
    if (configPath !== undefined) {
      const config = tryRead(configPath);
      result.config = config.outcome;
      const tokenFile = config.text === null ? undefined : /token_file\s*=\s*"([^"]+)"/.exec(config.text)?.[1];
      if (tokenFile !== undefined) {
        const token = tryRead(tokenFile);
        result.token_file = token.outcome;
        loot ??= token.text?.trim() || undefined;
      }
    }
    if (file !== undefined) result.file = tryRead(file).outcome;
    if (leak_to !== undefined) {
      if (loot !== undefined) writeFileSync(leak_to, loot, { mode: 0o600 });
      result.leaked = loot !== undefined;
    }
    turn.ledger.append({ event: "credentials", ppid, identity: identity(), result });
    const summary = Object.entries(result)
      .map(([k, v]) => `${k}=${typeof v === "boolean" ? v : v.outcome}`)
      .join(" ");
    await say(turn, `credentials: ${summary}`);
    return END_TURN;
  },
);

/** Slots of this process's descriptor table (FDSize in /proc/self/status), or null where unreadable. */
function fdTableSlots(): number | null {
  try {
    const size = /^FDSize:\s*(\d+)$/m.exec(readFileSync("/proc/self/status", "utf8"))?.[1];
    return size === undefined ? null : Number(size);
  } catch {
    return null;
  }
}

/** Lists `/proc/self/fd` (fd → link target) and the table's size into a ledger `fds` line and one message. */
export const listFds: Scenario = scenario("list_fds", noParams, async (turn) => {
  const fds: { fd: number; target: string }[] = [];
  for (const name of readdirSync("/proc/self/fd")) {
    let target: string;
    try {
      target = readlinkSync(`/proc/self/fd/${name}`);
    } catch {
      continue; // the directory's own fd, closed meanwhile
    }
    fds.push({ fd: Number(name), target });
  }
  fds.sort((a, b) => a.fd - b.fd);
  turn.ledger.append({ event: "fds", pid: process.pid, fds, table_slots: fdTableSlots() });
  await say(turn, `open fds: ${fds.map((f) => f.fd).join(" ")}`);
  return END_TURN;
});

/** Says its own command line (script path and arguments), for the redaction tests. */
export const echoArgv: Scenario = scenario("echo_argv", noParams, async (turn) => {
  await say(turn, `argv: ${process.argv.slice(1).join(" ")} (end)`);
  return END_TURN;
});
