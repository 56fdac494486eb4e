/**
 * The run's Redactor: the one place an agent-provided string is made safe to
 * leave the Runner (event text, titles, paths, ids, option names, config
 * snapshot values, the diagnostics file's stderr tail).
 */
import { terminalSafe } from "@webcodex/protocol";

/** Mapped env values shorter than this are not redacted (they would mangle ordinary text). */
export const MIN_REDACTED_LENGTH = 6;
export const REDACTED = "[redacted]";
/**
 * Scrubs every agent-provided string before it enters an event (text, titles,
 * paths, ids, option names, config snapshot values): first terminal-safe
 * (`terminalSafe`: no ESC/CSI/OSC sequences, no C0/C1 or bidi controls but
 * newline and tab — before the secrets, so a control character cannot split a
 * secret past the match), then every secret (≥ 6 chars: mapped env values,
 * the agent's executable path, its argv elements) becomes REDACTED, then the
 * project root's absolute path is made relative (`<root>/src/a.js` →
 * `src/a.js`, `<root>` → `.`), so private paths stay on the Runner.
 */
export class Redactor {
  readonly #secrets: string[];
  /** Secrets and the root: texts whose beginning at the end of a flushed event must be held back. */
  readonly #holdable: string[];
  /** Matches the root followed by a separator (dropped) or by a non-name character / the end (→ "."). */
  readonly #root: RegExp | null;
  /**
   * The redactor of one run (issue 12 §3): the child's mapped env values, a run_as pool's HOMEs, the
   * agent's executable path and every argv element longer than 5 characters
   * (an argv element that is the project root itself is left to the root's
   * relativization), and the project root.
   */
  static forAgent(
    agent: {
      readonly executable: string;
      readonly args: readonly string[];
      readonly runAs?: { readonly users: readonly { readonly home: string }[] } | null;
    },
    env: Readonly<Record<string, string>>,
    projectRoot: string,
  ): Redactor {
    const root = projectRoot.replace(/[/\\]+$/, "");
    const argv = agent.args.filter((arg) => arg.replace(/[/\\]+$/, "") !== root);
    // A run_as agent's HOME is set by the spawn (process/run-as.ts runAsEnv), not mapped: its pool's HOMEs.
    const homes = agent.runAs?.users.map((u) => u.home) ?? [];
    return new Redactor([...Object.values(env), ...homes, agent.executable, ...argv], projectRoot);
  }

  constructor(values: Iterable<string>, projectRoot: string | null = null) {
    this.#secrets = [...new Set([...values].filter((v) => v.length >= MIN_REDACTED_LENGTH))].sort(
      (a, b) => b.length - a.length,
    );
    const root = projectRoot?.replace(/[/\\]+$/, "") ?? "";
    this.#holdable = root.length > 1 ? [...this.#secrets, root] : this.#secrets;
    this.#root =
      root.length > 1
        ? new RegExp(`${root.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}(?:[/\\\\]|(?![\\w-]|\\.[\\w.-]))`, "g")
        : null;
  }
  /**
   * Length of the longest suffix of `text` that is a proper prefix of a secret
   * (or of the project root): text that may continue into a secret with the
   * next chunk, so it must not be emitted yet. At most the longest secret's
   * length − 1.
   */
  heldSuffixLength(text: string): number {
    let held = 0;
    for (const secret of this.#holdable) {
      const from = Math.max(0, text.length - secret.length + 1);
      // The first matching start gives this secret's longest suffix; stop at the best so far.
      for (let i = from; i < text.length - held; i++) {
        if (text.charCodeAt(i) === secret.charCodeAt(0) && secret.startsWith(text.slice(i))) {
          held = text.length - i;
          break;
        }
      }
    }
    return held;
  }
  redact(text: string): string {
    let out = terminalSafe(text);
    for (const secret of this.#secrets) if (out.includes(secret)) out = out.split(secret).join(REDACTED);
    if (this.#root) out = out.replace(this.#root, (m) => (m.length > 0 && /[/\\]$/.test(m) ? "" : "."));
    return out;
  }
}
