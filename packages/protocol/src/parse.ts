/**
 * Boundary parsing of frames. Never throws on hostile input: oversized text
 * is rejected before parsing, nesting is bounded before JSON.parse, and the
 * first bad field is named in the error.
 */
import type { z } from "zod";
import { MAX_FRAME_BYTES, MAX_FRAME_DEPTH } from "./bounds.js";
import { type ProtocolErrorCode, RunnerFrame, ServerFrame } from "./frames.js";

export interface FrameError {
  code: Extract<ProtocolErrorCode, "frame_too_large" | "invalid_json" | "too_deep" | "invalid_frame">;
  /** Secret-free description naming the first bad field (never echoes values). */
  message: string;
  /** Dotted path of the first bad field, or null when the frame as a whole is bad. */
  path: string | null;
}

export type ParseResult<T> = { ok: true; frame: T } | { ok: false; error: FrameError };

/** Depth of `[`/`{` nesting outside strings; stops early once `limit` is exceeded. */
function exceedsDepth(text: string, limit: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x7b || c === 0x5b) {
      if (++depth > limit) return true;
    } else if (c === 0x7d || c === 0x5d) depth--;
  }
  return false;
}

export function formatPath(path: ReadonlyArray<PropertyKey>): string {
  let out = "";
  for (const part of path) {
    if (typeof part === "number") out += `[${part}]`;
    else out += out === "" ? String(part) : `.${String(part)}`;
  }
  return out;
}

/** Turn the first zod issue into a path + message that never echoes input values. */
export function describeFirstIssue(error: z.ZodError): { path: string | null; message: string } {
  const issue = error.issues[0];
  if (!issue) return { path: null, message: "invalid frame" };
  const path = [...issue.path];
  let reason: string;
  switch (issue.code) {
    case "unrecognized_keys": {
      const key = issue.keys[0] ?? "?";
      path.push(key);
      reason = "unknown field (not allowed)";
      break;
    }
    case "invalid_union":
      reason = "does not match any allowed variant";
      break;
    default:
      reason = issue.message;
  }
  const p = path.length > 0 ? formatPath(path) : null;
  return { path: p, message: p ? `${p}: ${reason}` : reason };
}

function parseWith<T>(schema: z.ZodType<T>, text: unknown): ParseResult<T> {
  if (typeof text !== "string") {
    return { ok: false, error: { code: "invalid_frame", message: "frame must be a JSON text", path: null } };
  }
  if (text.length > MAX_FRAME_BYTES || Buffer.byteLength(text, "utf8") > MAX_FRAME_BYTES) {
    return {
      ok: false,
      error: { code: "frame_too_large", message: `frame exceeds ${MAX_FRAME_BYTES} bytes`, path: null },
    };
  }
  if (exceedsDepth(text, MAX_FRAME_DEPTH)) {
    return {
      ok: false,
      error: { code: "too_deep", message: `frame nests deeper than ${MAX_FRAME_DEPTH} levels`, path: null },
    };
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return { ok: false, error: { code: "invalid_json", message: "frame is not valid JSON", path: null } };
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return { ok: false, error: { code: "invalid_frame", message: "frame must be a JSON object", path: null } };
  }
  const result = schema.safeParse(value);
  if (result.success) return { ok: true, frame: result.data };
  const { path, message } = describeFirstIssue(result.error);
  return { ok: false, error: { code: "invalid_frame", message, path } };
}

/** Parse a frame sent by a Runner (what the Server receives). */
export function parseRunnerFrame(text: unknown): ParseResult<RunnerFrame> {
  return parseWith(RunnerFrame, text);
}

/** Parse a frame sent by the Server (what a Runner receives). */
export function parseServerFrame(text: unknown): ParseResult<ServerFrame> {
  return parseWith(ServerFrame, text);
}

/** Serialize a frame, refusing one that the peer would reject for size. */
export function encodeFrame(frame: RunnerFrame | ServerFrame): string {
  const text = JSON.stringify(frame);
  if (Buffer.byteLength(text, "utf8") > MAX_FRAME_BYTES) {
    throw new RangeError(`frame of type ${frame.type} exceeds ${MAX_FRAME_BYTES} bytes`);
  }
  return text;
}
