import { describe, expect, it } from "vitest";
import { CliError } from "../src/errors.js";
import { parseSessionCommand } from "../src/session-args.js";
import { parseTaskCommand } from "../src/task-args.js";

function usageError(fn: () => unknown): CliError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(CliError);
    return err as CliError;
  }
  throw new Error("expected a usage error");
}

describe("task and session argument parsing share one skeleton", () => {
  it("both read the same global flags and treat help the same way", () => {
    for (const help of [[], ["help"], ["--help"], ["-h"], ["show", "x", "--help"]]) {
      expect(parseTaskCommand(help)).toBeNull();
      expect(parseSessionCommand(help)).toBeNull();
    }
    const g = ["--url", "http://127.0.0.1:1", "--token", "t", "--json"];
    const expected = { url: "http://127.0.0.1:1", token: "t", json: true };
    expect(parseTaskCommand(["show", "wc_task_x", ...g])?.global).toEqual(expected);
    expect(parseSessionCommand(["show", "wc_sess_x", ...g])?.global).toEqual(expected);
  });

  it("usage errors name their own family, the flag and what is allowed", () => {
    expect(usageError(() => parseTaskCommand(["nope"])).message).toBe('unknown task command "nope"');
    expect(usageError(() => parseSessionCommand(["nope"])).message).toBe('unknown session command "nope"');
    expect(usageError(() => parseSessionCommand(["nope"])).hint).toContain("webcodex session --help");
    expect(usageError(() => parseTaskCommand(["show"])).message).toBe("expected one TASK_ID, got 0");
    expect(usageError(() => parseSessionCommand(["show", "a", "b"])).message).toBe("expected one SESSION_ID, got 2");
    expect(usageError(() => parseSessionCommand(["create", "--project", " "])).message).toBe("missing --project ID");
    expect(usageError(() => parseTaskCommand(["attempt", "t", "--assignee", "h", "--lease", "0"])).message).toBe(
      '--lease expects a whole number of seconds, got "0"',
    );
    expect(usageError(() => parseSessionCommand(["show", "s", "--after", "1.5"])).message).toBe(
      '--after expects a whole number ≥ 0, got "1.5"',
    );
    expect(usageError(() => parseSessionCommand(["show", "s", "--bogus"])).message).toContain("--bogus");
  });
});
