/**
 * Build step (run by the root `build`/`prepare`/`pretest` scripts and by scripts/vitest/build.ts before
 * `tsc -b`): generates packages/runner/generated/session-update-validator.js, one ajv standalone validator
 * per `session/update` variant, from the JSON Schema the ACP SDK exports
 * (`@agentclientprotocol/sdk/schema/v1/schema.json`). The file is gitignored; the Runner loads it through
 * packages/runner/src/acp/session-update-validator.ts.
 *
 * Contract of a generated validator: it accepts a `session/update` params value only if the SDK's own parse
 * (`zSessionNotification`) accepts it AND returns a value deep-equal to it. So every object is closed
 * (zod strips unknown keys: an input with one takes the SDK's path), a `_meta` record may not hold a
 * `__proto__` key, and the salvage annotations (`x-deserialize-default-on-error`, `-skip-invalid-items`)
 * are ignored, i.e. an input that needs salvaging is rejected here and salvaged by the SDK. Anything in the
 * schema this file does not know how to close exactly (a keyword, a format, an object that is neither closed
 * nor a plain record) leaves that variant out: it then takes the SDK's path, and the file lists why.
 *
 * Usage: node scripts/build/session-update-validator.mjs
 */
import { createHash } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import Ajv2020 from "ajv/dist/2020.js";
import standaloneCode from "ajv/dist/standalone/index.js";

const REPO = resolve(fileURLToPath(new URL("../..", import.meta.url)));
export const OUTPUT = resolve(REPO, "packages/runner/generated/session-update-validator.js");
/** Resolved from the Runner's package, as the Runner resolves the SDK at run time. */
const SCHEMA_FILE = createRequire(resolve(REPO, "packages/runner/package.json")).resolve(
  "@agentclientprotocol/sdk/schema/v1/schema.json",
);

/** Keywords that only annotate: dropped. */
const ANNOTATIONS = new Set(["description", "title", "discriminator", "x-side", "x-method"]);
/** Salvage annotations: a valid value is never salvaged, so the closed schema validates without them. */
const SALVAGE = new Set(["x-deserialize-default-on-error", "x-deserialize-skip-invalid-items"]);
const VALIDATION = new Set([
  "type",
  "properties",
  "required",
  "additionalProperties",
  "items",
  "const",
  "enum",
  "minimum",
  "maximum",
  "minLength",
  "format",
]);
/**
 * The SDK's zod for each JSON Schema format: uint32 is `z.int().gte(0).max(2^32 - 1)`; int64 and uint64 are
 * `wideInt()` (any integer, `minimum` carried by the schema); double is `z.number()`.
 */
const FORMATS = {
  uint32: (node) => ({ ...node, maximum: Math.min(node.maximum ?? Number.POSITIVE_INFINITY, 4294967295) }),
  int64: (node) => node,
  uint64: (node) => node,
  double: (node) => node,
};

class Unsupported extends Error {}

const MAX_SAFE = Number.MAX_SAFE_INTEGER;

/** Normalizes one schema node into a closed, $ref-free form (see the file comment). */
function normalizer(defs) {
  const norm = (node, path) => {
    if (node === true || node === false) return node;
    if (node === null || typeof node !== "object" || Array.isArray(node))
      throw new Unsupported(`${path}: not a schema`);
    const own = {};
    for (const [key, value] of Object.entries(node)) {
      if (ANNOTATIONS.has(key) || SALVAGE.has(key) || ["$ref", "allOf", "oneOf", "anyOf"].includes(key)) continue;
      if (key.startsWith("x-")) throw new Unsupported(`${path}: annotation ${key}`);
      if (!VALIDATION.has(key)) throw new Unsupported(`${path}: keyword ${key}`);
      if (key === "properties") {
        own.properties = Object.fromEntries(Object.entries(value).map(([k, v]) => [k, norm(v, `${path}.${k}`)]));
      } else if (key === "items") {
        own.items = norm(value, `${path}[]`);
      } else if (key === "additionalProperties") {
        if (value !== true) throw new Unsupported(`${path}: additionalProperties other than true`);
        own.additionalProperties = true;
      } else if (key !== "format") {
        own[key] = value;
      }
    }
    let result = own;
    if (node.format === undefined && [node.type].flat().includes("integer")) {
      // An integer without a format: zod may check a safe integer; these bounds are never more lenient.
      result = { ...result, minimum: Math.max(result.minimum ?? -MAX_SAFE, -MAX_SAFE) };
      result = { ...result, maximum: Math.min(result.maximum ?? MAX_SAFE, MAX_SAFE) };
    }
    if (typeof node.format === "string") {
      const format = FORMATS[node.format];
      if (format === undefined) throw new Unsupported(`${path}: format ${node.format}`);
      result = format(result);
    }
    if (node.$ref !== undefined) {
      const name = /^#\/\$defs\/([^/]+)$/.exec(node.$ref)?.[1];
      if (name === undefined || defs[name] === undefined) throw new Unsupported(`${path}: $ref ${node.$ref}`);
      result = conj(result, norm(defs[name], name), path);
    }
    for (const [i, part] of (node.allOf ?? []).entries()) result = conj(result, norm(part, `${path}/allOf/${i}`), path);
    for (const union of ["oneOf", "anyOf"]) {
      if (node[union] === undefined) continue;
      const branches = node[union].map((b, i) => norm(b, `${path}/${union}/${i}`));
      result = conj(result, { [union]: branches }, path);
    }
    return close(result, path);
  };
  return norm;
}

const isUnion = (node) => typeof node === "object" && (node.oneOf !== undefined || node.anyOf !== undefined);
const types = (node) => (node.type === undefined ? null : [node.type].flat());

/** The intersection of two normalized nodes (zod `.and`): unions distribute, objects merge their properties. */
function conj(a, b, path) {
  if (a === true || (typeof a === "object" && Object.keys(a).length === 0)) return b;
  if (b === true || (typeof b === "object" && Object.keys(b).length === 0)) return a;
  if (a === false || b === false) return false;
  if (isUnion(a)) {
    const union = a.oneOf ? "oneOf" : "anyOf";
    return { [union]: a[union].map((branch) => close(conj(branch, b, path), path)) };
  }
  if (isUnion(b)) return conj(b, a, path);
  const out = { ...a };
  for (const [key, value] of Object.entries(b)) {
    if (out[key] === undefined) out[key] = value;
    else if (key === "properties") {
      for (const [k, v] of Object.entries(value)) {
        if (out.properties[k] !== undefined && JSON.stringify(out.properties[k]) !== JSON.stringify(v)) {
          throw new Unsupported(`${path}: property ${k} defined twice`);
        }
      }
      out.properties = { ...out.properties, ...value };
    } else if (key === "required") out.required = [...new Set([...out.required, ...value])];
    else if (key === "type") {
      const both = types(a).filter((t) => types(b).includes(t));
      if (both.length === 0) return false;
      out.type = both.length === 1 ? both[0] : both;
    } else if (JSON.stringify(out[key]) !== JSON.stringify(value)) {
      throw new Unsupported(`${path}: ${key} given twice`);
    }
  }
  return out;
}

/**
 * Closes an object node: one with `properties` rejects any other key (zod strips them); a plain record
 * (`additionalProperties: true`, no properties: zod's `z.record(z.string(), z.unknown())`) rejects a
 * `__proto__` key, which zod's output would turn into a prototype. An object with neither is not known.
 */
function close(node, path) {
  if (typeof node !== "object" || isUnion(node)) return node;
  const objectish =
    node.properties !== undefined || node.additionalProperties !== undefined || types(node)?.includes("object");
  if (!objectish) return node;
  if (node.properties !== undefined) {
    if (node.additionalProperties === true) throw new Unsupported(`${path}: open object with properties`);
    return { ...node, additionalProperties: false };
  }
  if (node.additionalProperties === true) return { ...node, propertyNames: { not: { const: "__proto__" } } };
  // A bare `type: object` is neutral inside an intersection; alone it is not known.
  return node;
}

/** Fails (as Unsupported) when `node` still holds an object that is neither closed nor a record. */
function assertClosed(node, path) {
  if (typeof node !== "object" || node === null) return;
  if (isUnion(node)) {
    for (const [i, branch] of (node.oneOf ?? node.anyOf).entries()) assertClosed(branch, `${path}/${i}`);
    return;
  }
  const objectish = node.properties !== undefined || types(node)?.includes("object");
  if (objectish && node.additionalProperties !== false && node.propertyNames === undefined) {
    throw new Unsupported(`${path}: object neither closed nor a record`);
  }
  for (const [k, v] of Object.entries(node.properties ?? {})) assertClosed(v, `${path}.${k}`);
  if (node.items !== undefined) assertClosed(node.items, `${path}[]`);
}

/**
 * Smaller, equivalent forms that make the generated code shorter and faster: a union of string consts is an
 * enum, and `anyOf: [X, {type: "null"}]` for a non-union X with one `type` is X with "null" added to its type
 * (and to its enum); the other keywords of X apply only to X's type, so null passes them.
 */
function simplify(node) {
  if (typeof node !== "object" || node === null) return node;
  const out = Array.isArray(node)
    ? node.map(simplify)
    : Object.fromEntries(Object.entries(node).map(([k, v]) => [k, k === "const" || k === "enum" ? v : simplify(v)]));
  const union = out.oneOf ?? out.anyOf;
  if (!Array.isArray(union) || Object.keys(out).length !== 1) return out;
  const isStringConst = (b) =>
    typeof b.const === "string" && Object.keys(b).every((k) => k === "const" || (k === "type" && b.type === "string"));
  if (union.every(isStringConst) && new Set(union.map((b) => b.const)).size === union.length) {
    return { type: "string", enum: union.map((b) => b.const) };
  }
  if (out.anyOf !== undefined && union.length === 2) {
    const nullAt = union.findIndex((b) => Object.keys(b).length === 1 && b.type === "null");
    const other = union[1 - nullAt];
    if (nullAt >= 0 && !isUnion(other) && typeof other.type === "string" && other.const === undefined) {
      return { ...other, type: [other.type, "null"], ...(other.enum ? { enum: [...other.enum, null] } : {}) };
    }
  }
  return out;
}

const isObjectBranch = (b) => typeof b === "object" && b.properties !== undefined && !isUnion(b);
const isArrayBranch = (b) => typeof b === "object" && b.items !== undefined && !isUnion(b);

/** The JSON types a normalized node can accept ("integer" counted as "number"), or null for any. */
function typesOf(node) {
  if (node === true || typeof node !== "object") return null;
  if (isUnion(node)) {
    const all = (node.oneOf ?? node.anyOf).map(typesOf);
    return all.some((t) => t === null) ? null : [...new Set(all.flat())];
  }
  if (node.type !== undefined) return [node.type].flat().map((t) => (t === "integer" ? "number" : t));
  if (node.properties !== undefined) return ["object"];
  if (node.items !== undefined) return ["array"];
  return null;
}

/** Whether every value `later` (closed) accepts is refused by `earlier` even with unknown keys allowed. */
function excludes(earlier, later) {
  const a = typesOf(earlier);
  const b = typesOf(later);
  if (a !== null && b !== null && !a.some((t) => b.includes(t))) return true;
  if (isObjectBranch(earlier) && isObjectBranch(later)) {
    const laterKeys = Object.keys(later.properties);
    // A key `earlier` requires that `later` cannot hold, or a tag both require with different consts.
    return (earlier.required ?? []).some((key) => {
      if (!laterKeys.includes(key)) return true;
      const a = earlier.properties[key]?.const;
      const b = later.properties[key]?.const;
      return later.required?.includes(key) && typeof a === "string" && typeof b === "string" && a !== b;
    });
  }
  if (isArrayBranch(earlier) && isArrayBranch(later)) return excludes(earlier.items, later.items);
  // Anything else is left to the object and array cases below (primitives come out of zod unchanged).
  return false;
}

/**
 * zod's union returns the first option that accepts a value, stripping keys that option does not know; the
 * JSON Schema union here accepts a value by its closed branch. The two agree on the output only when a value
 * a closed branch accepts is refused by every earlier branch (or the branches only hold primitives, which zod
 * returns as they are). Throws Unsupported where that is not shown.
 */
function assertFirstMatchSafe(node, path) {
  if (typeof node !== "object" || node === null) return;
  const union = node.oneOf ?? node.anyOf;
  if (Array.isArray(union)) {
    const structured = (b) => isObjectBranch(b) || isArrayBranch(b) || isUnion(b);
    for (let i = 1; i < union.length; i++) {
      for (let j = 0; j < i; j++) {
        if (!structured(union[i]) && !structured(union[j])) continue;
        if (!excludes(union[j], union[i])) throw new Unsupported(`${path}: union branch ${i} may parse as ${j}`);
      }
    }
  }
  for (const [key, value] of Object.entries(node)) {
    if (key === "const" || key === "enum") continue;
    if (key === "properties") {
      for (const [k, v] of Object.entries(value)) assertFirstMatchSafe(v, `${path}.${k}`);
    } else if (typeof value === "object") assertFirstMatchSafe(value, `${path}/${key}`);
  }
}

/** Adds ajv's `discriminator` to every `oneOf` whose closed branches each require a distinct const tag. */
function discriminate(node) {
  if (typeof node !== "object" || node === null) return node;
  const out = Array.isArray(node)
    ? node.map(discriminate)
    : Object.fromEntries(
        Object.entries(node).map(([k, v]) => [k, k === "const" || k === "enum" ? v : discriminate(v)]),
      );
  if (Array.isArray(out.oneOf) && out.oneOf.length > 1) {
    const first = out.oneOf[0];
    for (const key of first.required ?? []) {
      const tags = out.oneOf.map((b) =>
        b.required?.includes(key) && typeof b.properties?.[key]?.const === "string" ? b.properties[key].const : null,
      );
      if (tags.every((t) => t !== null) && new Set(tags).size === tags.length) {
        out.type = "object";
        out.discriminator = { propertyName: key };
        break;
      }
    }
  }
  return out;
}

/** Property and item schemas at least this long (as JSON) that occur more than once become one shared `$ref`. */
const SHARE_MIN_JSON = 1000;
const SHARED_ID = "shared";

/**
 * Replaces every property or item schema of `SHARE_MIN_JSON`+ characters that occurs more than once across
 * `variants` by a `$ref` into one shared schema, so the generated file holds its code once (same checks).
 */
function share(variants) {
  const counts = new Map();
  const visit = (node, fn) => {
    if (typeof node !== "object" || node === null) return node;
    if (Array.isArray(node)) return node.map((n) => visit(n, fn));
    const out = {};
    for (const [k, v] of Object.entries(node)) {
      if (k === "const" || k === "enum") out[k] = v;
      else if (k === "properties") {
        out.properties = Object.fromEntries(Object.entries(v).map(([p, x]) => [p, fn(visit(x, fn))]));
      } else if (k === "items") out.items = fn(visit(v, fn));
      else out[k] = visit(v, fn);
    }
    return out;
  };
  const key = (node) => JSON.stringify(node);
  for (const variant of Object.values(variants)) {
    visit(variant, (node) => {
      const k = key(node);
      if (k.length >= SHARE_MIN_JSON) counts.set(k, (counts.get(k) ?? 0) + 1);
      return node;
    });
  }
  const defs = {};
  const names = new Map();
  const ref = (node) => {
    const k = key(node);
    if ((counts.get(k) ?? 0) < 2) return node;
    let name = names.get(k);
    if (name === undefined) {
      name = `s${names.size}`;
      names.set(k, name);
      defs[name] = node;
    }
    return { $ref: `${SHARED_ID}#/$defs/${name}` };
  };
  const out = Object.fromEntries(Object.entries(variants).map(([n, v]) => [n, visit(v, ref)]));
  return { variants: out, shared: { $id: SHARED_ID, $defs: defs } };
}

/**
 * The closed JSON Schema of a whole `session/update` params value for each variant of `schema` (an ACP
 * schema.json), by `sessionUpdate` tag, and why each variant left out is left out.
 */
export function closedVariants(schema) {
  const defs = schema.$defs ?? {};
  const norm = normalizer(defs);
  const notification = defs.SessionNotification;
  const sessionUpdate = defs.SessionUpdate;
  const variants = {};
  const unsupported = {};
  if (notification?.properties?.update === undefined || !Array.isArray(sessionUpdate?.oneOf)) {
    unsupported["*"] = "SessionNotification.update is not a oneOf of variants";
  } else {
    const { update: _update, ...rest } = notification.properties;
    for (const [i, raw] of sessionUpdate.oneOf.entries()) {
      const tag = raw.properties?.sessionUpdate?.const;
      const name = typeof tag === "string" ? tag : `#${i}`;
      try {
        if (typeof tag !== "string") throw new Unsupported(`SessionUpdate/oneOf/${i}: no sessionUpdate const`);
        const whole = norm({ ...notification, properties: { ...rest, update: raw } }, "SessionNotification");
        assertClosed(whole, "SessionNotification");
        if (Object.hasOwn(variants, name) || Object.hasOwn(unsupported, name)) {
          throw new Unsupported(`SessionUpdate: two variants tagged ${name}`);
        }
        assertFirstMatchSafe(whole, "SessionNotification");
        variants[name] = discriminate(simplify(whole));
      } catch (error) {
        if (!(error instanceof Unsupported)) throw error;
        unsupported[name] = error.message;
      }
    }
  }
  return { variants, unsupported };
}

/** ESM source exporting one standalone validator `v_<tag>` per entry of `variants`; imports nothing. */
export function compile(variants) {
  const ajv = new Ajv2020({
    code: { source: true, esm: true, optimize: true },
    discriminator: true,
    allErrors: false,
    inlineRefs: false,
    // String lengths as zod counts them (`.length`), and no runtime import in the generated file.
    unicode: false,
    strict: true,
    validateFormats: false,
    // Only accept/reject is read: no error messages in the generated file, and no deprecation notice on stdout.
    messages: false,
    logger: false,
  });
  const exportsById = {};
  const sharing = share(variants);
  ajv.addSchema(sharing.shared);
  for (const [name, variant] of Object.entries(sharing.variants)) {
    const id = `v_${name}`;
    ajv.addSchema(variant, id);
    exportsById[id] = id;
  }
  const code = Object.keys(exportsById).length > 0 ? standaloneCode(ajv, exportsById) : "";
  if (/\brequire\(|^import /m.test(code)) throw new Error("generated validator imports a runtime module");
  return code;
}

export function generate() {
  const text = readFileSync(SCHEMA_FILE, "utf8");
  const { variants, unsupported } = closedVariants(JSON.parse(text));
  const code = compile(variants);
  const sha256 = createHash("sha256").update(text).digest("hex");
  const names = Object.keys(variants);
  const out = [
    "// Generated by scripts/build/session-update-validator.mjs from @agentclientprotocol/sdk/schema/v1/schema.json; do not edit.",
    code,
    `export const SCHEMA_SHA256 = ${JSON.stringify(sha256)};`,
    `export const VALIDATORS = { ${names.map((n) => `${JSON.stringify(n)}: v_${n}`).join(", ")} };`,
    `export const UNSUPPORTED = ${JSON.stringify(unsupported)};`,
    "",
  ].join("\n");
  mkdirSync(dirname(OUTPUT), { recursive: true });
  writeFileSync(OUTPUT, out);
  return { variants: names, unsupported };
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const { variants, unsupported } = generate();
  const left = Object.entries(unsupported);
  process.stdout.write(
    `session-update-validator: ${variants.length} variants${left.length ? `; SDK path for ${left.map(([n, why]) => `${n} (${why})`).join(", ")}` : ""}\n`,
  );
}
