import type { SessionConfig } from "./config-options.js";

/** One ACP session: its cwd, live config, and the cancel switch of running turns. */
export class Session {
  private readonly turns = new Set<AbortController>();

  constructor(
    readonly id: string,
    readonly cwd: string,
    readonly config: SessionConfig,
  ) {}

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
