import type { AnyMessage, Stream } from "@agentclientprotocol/sdk";

type WrittenHook = (message: AnyMessage) => void;

/**
 * The agent's only writer to stdout. Each write resolves once Node has handed
 * the bytes to the OS, so awaiting a `sessionUpdate` applies backpressure: a
 * client that stops reading stalls the agent instead of growing its memory.
 * (On Linux, Node writes stdout pipes synchronously, so there the whole agent
 * blocks in `write` until the reader drains the pipe.)
 */
export class StdoutSink {
  private readonly hooks = new Set<WrittenHook>();

  readonly bytes = new WritableStream<Uint8Array>({
    write: (chunk) => writeStdout(chunk),
  });

  /** Wraps the SDK stream so hooks see each message after its bytes are flushed. */
  observe(stream: Stream): Stream {
    const writer = stream.writable.getWriter();
    return {
      readable: stream.readable,
      writable: new WritableStream<AnyMessage>({
        write: async (message) => {
          await writer.write(message);
          for (const hook of this.hooks) hook(message);
        },
        close: () => writer.close(),
        abort: (reason) => writer.abort(reason),
      }),
    };
  }

  /** Runs `hook` after every message that has been flushed to stdout. */
  onWritten(hook: WrittenHook): void {
    this.hooks.add(hook);
  }

  /** Writes one raw line, bypassing the SDK (malformed / oversized scenarios only). */
  rawLine(text: string): Promise<void> {
    return writeStdout(`${text}\n`);
  }
}

function writeStdout(chunk: Uint8Array | string): Promise<void> {
  return new Promise((resolve, reject) => {
    process.stdout.write(chunk, (error) => (error ? reject(error) : resolve()));
  });
}
