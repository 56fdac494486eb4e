import { END_TURN, noParams, type Scenario, say, scenario } from "../turn.js";

/** A prompt line `nonce: …` is what `recall` remembers of a turn. */
const NONCE_LINE = /^nonce:.*$/m;

/**
 * Replies `recall: <the nonce line of the session's previous prompt>`, or `recall: nothing` when the
 * session saw no earlier prompt (or it had no nonce line): a resumed or loaded session remembers the
 * turn before, a fresh one does not.
 */
export const recall: Scenario = scenario("recall", noParams, async (turn) => {
  const previous = turn.session.prompts.at(-2);
  const line = previous === undefined ? null : (NONCE_LINE.exec(previous)?.[0] ?? null);
  await say(turn, `recall: ${line ?? "nothing"}`);
  return END_TURN;
});
