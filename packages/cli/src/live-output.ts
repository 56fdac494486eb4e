/**
 * Writes rendered text to a stream and, on a TTY, keeps a one-line spinner
 * with the elapsed time below it. The spinner is only drawn while the
 * cursor is at the start of a line, so streamed message text is never
 * interleaved with it.
 */
import { formatDuration } from "./render-summary.js";
import { paint, type Style } from "./style.js";

const FRAMES = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

export interface OutputStream {
  write(chunk: string): boolean;
  isTTY?: boolean;
}

export class LiveOutput {
  readonly #stream: OutputStream;
  readonly #style: Style;
  readonly #spinner: boolean;
  #atLineStart = true;
  #drawn = false;
  #label: string | undefined;
  #startedAt = Date.now();
  #frame = 0;
  #timer: NodeJS.Timeout | undefined;

  constructor(stream: OutputStream, style: Style, options: { spinner: boolean }) {
    this.#stream = stream;
    this.#style = style;
    this.#spinner = options.spinner && stream.isTTY === true && style.mode === "text";
  }

  /** Starts the spinner clock, or sets it to another start (the spinner itself only on a TTY). */
  start(startedAt: number = Date.now()): void {
    if (Number.isFinite(startedAt)) this.#startedAt = startedAt;
    if (!this.#spinner || this.#timer !== undefined) return;
    this.#timer = setInterval(() => {
      this.#frame = (this.#frame + 1) % FRAMES.length;
      this.#draw();
    }, 100);
    this.#timer.unref();
  }

  setStatus(label: string | undefined): void {
    this.#label = label;
    this.#draw();
  }

  write(text: string): void {
    if (text === "") return;
    this.#clear();
    this.#stream.write(text);
    this.#atLineStart = text.endsWith("\n");
    this.#draw();
  }

  /** Ends the current line if a message was streaming, and removes the spinner. */
  stop(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
    this.#clear();
    this.#label = undefined;
  }

  get atLineStart(): boolean {
    return this.#atLineStart;
  }

  #clear(): void {
    if (!this.#drawn) return;
    this.#stream.write("\r\u001b[2K");
    this.#drawn = false;
  }

  #draw(): void {
    if (!this.#spinner || this.#timer === undefined || this.#label === undefined || !this.#atLineStart) return;
    // Never negative: a start time from another machine's clock may lie slightly ahead of ours.
    const elapsed = formatDuration(Math.max(0, Date.now() - this.#startedAt));
    const line = `${paint(this.#style, "cyan", FRAMES[this.#frame] ?? "")} ${this.#label} ${paint(this.#style, "dim", `· ${elapsed}`)}`;
    this.#stream.write(`\r\u001b[2K${line}`);
    this.#drawn = true;
  }
}
