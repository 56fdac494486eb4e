/**
 * "did you mean …?" for an unknown config key: the known key of the same table nearest to it, read from the
 * zod schema that refused it. Both daemons' config loaders use it; it never echoes a value, only key names
 * the schema itself declares.
 */
import type { z } from "zod";

/** Farthest (edits: insert, delete, replace, swap two neighbours) a suggested key may be from the typed one. */
export const NEAREST_KEY_MAX_DISTANCE = 3;

/** Optimal string alignment distance (Damerau-Levenshtein without repeated edits of one substring). */
export function editDistance(a: string, b: string): number {
  const rows = a.length + 1;
  const cols = b.length + 1;
  const d: number[][] = Array.from({ length: rows }, (_, i) =>
    Array.from({ length: cols }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)),
  );
  for (let i = 1; i < rows; i++) {
    for (let j = 1; j < cols; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      const row = d[i] as number[];
      const up = d[i - 1] as number[];
      let best = Math.min((up[j] as number) + 1, (row[j - 1] as number) + 1, (up[j - 1] as number) + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) {
        best = Math.min(best, ((d[i - 2] as number[])[j - 2] as number) + 1);
      }
      row[j] = best;
    }
  }
  return (d[rows - 1] as number[])[cols - 1] as number;
}

/** The known name nearest to `name` within NEAREST_KEY_MAX_DISTANCE (and closer than its own length), or null. */
export function nearestName(name: string, known: Iterable<string>): string | null {
  let best: string | null = null;
  let bestDistance = Number.POSITIVE_INFINITY;
  const typed = name.toLowerCase();
  for (const k of known) {
    const distance = editDistance(typed, k.toLowerCase());
    if (distance < bestDistance) {
      best = k;
      bestDistance = distance;
    }
  }
  return bestDistance <= NEAREST_KEY_MAX_DISTANCE && bestDistance < name.length ? best : null;
}

interface Def {
  type: string;
  shape?: Record<string, z.ZodType>;
  innerType?: z.ZodType;
  element?: z.ZodType;
  in?: z.ZodType;
}

function defOf(schema: z.ZodType): Def {
  return (schema as unknown as { _zod: { def: Def } })._zod.def;
}

/** The keys of the object schema at `path` (array indexes step into the element), or [] when there is none. */
export function knownKeysAt(schema: z.ZodType, path: ReadonlyArray<PropertyKey>): string[] {
  let cur: z.ZodType | undefined = schema;
  let i = 0;
  for (let guard = 0; cur !== undefined && guard < 64; guard++) {
    const def = defOf(cur);
    if (def.innerType !== undefined) cur = def.innerType;
    else if (def.type === "pipe") cur = def.in;
    else if (i < path.length && def.type === "array") {
      cur = def.element;
      i++;
    } else if (i < path.length && def.type === "object") {
      cur = def.shape?.[String(path[i])];
      i++;
    } else if (i === path.length && def.type === "object") return Object.keys(def.shape ?? {});
    else return [];
  }
  return [];
}

/** ` (did you mean \`KEY\`?)` for an unknown `key` at `path` of `schema`, or "" when nothing is near. */
export function didYouMean(schema: z.ZodType, path: ReadonlyArray<PropertyKey>, key: string): string {
  const near = nearestName(key, knownKeysAt(schema, path));
  return near === null ? "" : ` (did you mean \`${near}\`?)`;
}
