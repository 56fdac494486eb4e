/**
 * The one tail of the CLI commands that change the Server's state (`token`, `webhooks`): run the command on the
 * opened state, answer a refusal of the expected kind with `<what> refused: <reason>` and exit 1, and close the
 * state on every path.
 */
export interface Refusal {
  /** The error class the command's store throws for a refused change (its message says why). */
  type: abstract new (
    ...args: never[]
  ) => Error;
  /** What was refused, as the operator typed it: "token issue", "webhooks add". */
  what: string;
}

export async function onState(
  state: { close(): Promise<void> },
  refusal: Refusal,
  command: () => Promise<number>,
): Promise<number> {
  try {
    return await command();
  } catch (err) {
    if (err instanceof refusal.type) {
      console.error(`${refusal.what} refused: ${err.message}`);
      return 1;
    }
    throw err;
  } finally {
    await state.close();
  }
}
