import type { SessionConfig } from "./config-options.js";

/** One ACP session: its cwd, live config, the prompts it saw, and the cancel switch of running turns. */
export class Session {
  private readonly turns = new Set<AbortController>();

  constructor(
    readonly id: string,
    readonly cwd: string,
    readonly config: SessionConfig,
    /** Prompt texts in arrival order (the current turn's last); loaded from the session dir on load/resume. */
    readonly prompts: string[] = [],
    /** Called after each new prompt so a persisted session keeps its history (no-op without --session-dir). */
    private readonly persist: (session: Session) => void = () => {},
  ) {}

  /** Records a prompt as it arrives, before its turn plays. */
  sawPrompt(text: string): void {
    this.prompts.push(text);
    this.persist(this);
  }

  /** Starts a turn; its signal aborts on `session/cancel` for this session. */
  beginTurn(): { signal: AbortSignal; end: () => void } {
    const controller = new AbortController();
    this.turns.add(controller);
    return { signal: controller.signal, end: () => this.turns.delete(controller) };
  }

  cancel(): void {
    for (const controller of this.turns) controller.abort(new Error("session/cancel"));
  }
}
