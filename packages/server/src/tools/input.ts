/**
 * Tool input parsing: a tool's zod schema (the protocol package's, the only validator) applied to the arguments,
 * and a failure turned into one message that names the field and never echoes a value.
 */
import { ConfigOptionId, MAX_PROMPT_BYTES } from "@webcodex/protocol";
import type { z } from "zod";
import { type ApiResult, apiError } from "./errors.js";

/** Unknown or config key names are cut to this many characters in error messages... */
export const MAX_ECHOED_KEY_LENGTH = 64;
/** ...and at most this many unknown keys are named ("and N more" for the rest). */
export const MAX_ECHOED_UNKNOWN_KEYS = 8;

function cutKey(key: string): string {
  return key.length > MAX_ECHOED_KEY_LENGTH ? `${key.slice(0, MAX_ECHOED_KEY_LENGTH)}…` : key;
}

/** A field path for a message: schema field names as they are; a config key only when it is a valid option id. */
function describePath(path: readonly PropertyKey[]): string {
  return path
    .map((seg, i) => {
      const name = String(seg);
      if (i === 1 && path[0] === "config" && !ConfigOptionId.safeParse(name).success) return "<invalid option id>";
      return cutKey(name);
    })
    .join(".");
}

/**
 * Turn a zod failure into one secret-free message. Unknown keys come first and
 * are named (each cut to MAX_ECHOED_KEY_LENGTH, at most MAX_ECHOED_UNKNOWN_KEYS of
 * them); otherwise the first issue's field path and reason. Input values are never echoed.
 */
export function describeInputError(error: z.ZodError, args?: unknown): string {
  const unknown: string[] = [];
  for (const issue of error.issues) {
    if (issue.code === "unrecognized_keys") {
      const prefix = issue.path.length > 0 ? `${describePath(issue.path)}.` : "";
      for (const key of issue.keys) unknown.push(`${prefix}${cutKey(key)}`);
    }
  }
  if (unknown.length > 0) {
    const shown = unknown.slice(0, MAX_ECHOED_UNKNOWN_KEYS).map((k) => `'${k}'`);
    const more = unknown.length - shown.length;
    const names = more > 0 ? `${shown.join(", ")} and ${more} more` : shown.join(", ");
    return `unknown field${unknown.length > 1 ? "s" : ""} ${names} not allowed`;
  }
  const issue = error.issues[0];
  if (!issue) return "invalid arguments";
  const path = issue.path.length > 0 ? describePath(issue.path) : "arguments";
  let reason = issue.message;
  if (issue.code === "invalid_type") {
    // zod does not keep the input on an issue: look the field up to tell "missing" from "wrong type".
    if (valueAt(args, issue.path) === undefined) reason = "required";
    else if (reason.startsWith("Invalid input: expected ")) reason = `must be ${withArticle(issue.expected)}`;
  }
  if (issue.code === "too_big" && path === "prompt") reason = `must be at most ${MAX_PROMPT_BYTES} UTF-8 bytes`;
  return `${path}: ${reason}`;
}

/** The value at a zod issue path inside `root`, or undefined (own properties only). */
function valueAt(root: unknown, path: readonly PropertyKey[]): unknown {
  let cur = root;
  for (const seg of path) {
    if (typeof cur !== "object" || cur === null || !Object.hasOwn(cur, seg)) return undefined;
    cur = (cur as Record<PropertyKey, unknown>)[seg];
  }
  return cur;
}

function withArticle(expected: string): string {
  if (expected === "int") return "an integer";
  return /^[aeiou]/.test(expected) ? `an ${expected}` : `a ${expected}`;
}

export function parseToolInput<T>(schema: z.ZodType<T>, args: unknown): ApiResult<T> {
  const result = schema.safeParse(args ?? {});
  if (result.success) return { ok: true, value: result.data };
  return { ok: false, error: apiError("invalid_input", describeInputError(result.error, args ?? {})) };
}
