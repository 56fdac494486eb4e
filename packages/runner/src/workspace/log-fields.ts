/**
 * What a workspace log line may say of a failure: the error's name and, for git, the subcommand and exit code —
 * never its arguments, a path or a line of a change.
 */
import { GitError } from "./git.js";

export function errName(error: unknown): string {
  return error instanceof Error ? error.name : typeof error;
}

/** A failure's log fields: its name and, for git, the subcommand and exit code (never arguments). */
export function failure(error: unknown): Record<string, string | number | null> {
  const named = { err_name: errName(error) };
  return error instanceof GitError ? { ...named, git_command: error.command, git_code: error.code } : named;
}
