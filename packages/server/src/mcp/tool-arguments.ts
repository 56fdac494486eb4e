/**
 * The shape checks every tool call's `arguments` passes before anything recursive touches them (zod,
 * JSON.stringify for the audit's byte count, logging). `JSON.parse` itself is iterative in V8 and
 * builds a value nested a million levels deep without complaint; `JSON.stringify` and schema
 * validation recurse and overflow the stack. So this walks the value with an explicit stack:
 *
 * - nesting deeper than MAX_TOOL_ARGUMENT_DEPTH is refused (our schemas need three levels);
 * - a key named `__proto__`, `constructor` or `prototype` anywhere is refused by name — JSON.parse
 *   makes `__proto__` an own property, and a schema or spread further on would otherwise drop it
 *   silently or, worse, let it reach an object's prototype;
 * - at most MAX_TOOL_ARGUMENT_NODES values are visited (the HTTP body bound keeps real calls far below).
 *
 * Messages name the field path (cut) and never echo a value.
 */

/** Deepest nesting of objects/arrays accepted in tool arguments (the top-level object is level 1). */
export const MAX_TOOL_ARGUMENT_DEPTH = 32;
/** Most values visited while checking one call's arguments. */
export const MAX_TOOL_ARGUMENT_NODES = 100_000;
/** Keys refused anywhere in tool arguments. */
export const RESERVED_ARGUMENT_KEYS: ReadonlySet<string> = new Set(["__proto__", "constructor", "prototype"]);

const MAX_PATH_SEGMENTS = 8;

function pathOf(segments: readonly string[]): string {
  if (segments.length === 0) return "arguments";
  const shown = segments.slice(0, MAX_PATH_SEGMENTS).map((s) => (s.length > 64 ? `${s.slice(0, 64)}…` : s));
  return shown.join(".") + (segments.length > MAX_PATH_SEGMENTS ? ".…" : "");
}

/** A precise refusal of `args`' shape, or null when it may go on to schema validation. */
export function checkArgumentShape(args: unknown): string | null {
  const stack: { value: unknown; depth: number; path: readonly string[] }[] = [{ value: args, depth: 1, path: [] }];
  let visited = 0;
  while (stack.length > 0) {
    const { value, depth, path } = stack.pop() as (typeof stack)[number];
    if (++visited > MAX_TOOL_ARGUMENT_NODES) {
      return `arguments: more than ${MAX_TOOL_ARGUMENT_NODES} values are not allowed`;
    }
    if (typeof value !== "object" || value === null) continue;
    if (depth > MAX_TOOL_ARGUMENT_DEPTH) {
      return `${pathOf(path.slice(0, MAX_PATH_SEGMENTS))}: nested deeper than ${MAX_TOOL_ARGUMENT_DEPTH} levels (not allowed)`;
    }
    if (Array.isArray(value)) {
      for (let i = value.length - 1; i >= 0; i--) {
        stack.push({
          value: value[i],
          depth: depth + 1,
          path: path.length < MAX_PATH_SEGMENTS ? [...path, `[${i}]`] : path,
        });
      }
      continue;
    }
    for (const key of Object.keys(value)) {
      const at = [...path, key];
      if (RESERVED_ARGUMENT_KEYS.has(key)) {
        return `${pathOf(at)}: the key '${key}' is reserved and not allowed in tool arguments`;
      }
      stack.push({
        value: (value as Record<string, unknown>)[key],
        depth: depth + 1,
        path: path.length < MAX_PATH_SEGMENTS ? at : path,
      });
    }
  }
  return null;
}
