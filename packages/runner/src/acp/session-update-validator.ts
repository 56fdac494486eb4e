/**
 * The one validation of a `session/update` notification on its way to the turn (design §4.3): a validator per
 * update variant, generated at build time (scripts/build/session-update-validator.mjs, into the gitignored
 * packages/runner/generated/) from the JSON Schema the ACP SDK exports
 * (`@agentclientprotocol/sdk/schema/v1/schema.json`).
 *
 * Contract: `accepts(params)` is true only when the SDK's own parse of `params` succeeds and yields a value
 * deep-equal to `params` (no unknown key to strip, nothing to salvage), so the turn may take `params` as the
 * parsed notification. False means "not certain": the message takes the SDK's own path, which accepts,
 * salvages or rejects it exactly as it would without this file. A missing generated file, or one generated
 * from a different schema.json than the installed SDK's, makes every update take the SDK's path.
 */
import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import type { SessionNotification } from "@agentclientprotocol/sdk";

type Validator = (value: unknown) => boolean;

export interface SessionUpdateValidators {
  /** True only when the SDK's parse accepts `params` and returns it unchanged (see the file comment). */
  accepts(params: unknown): params is SessionNotification;
  /** The `sessionUpdate` variants with a generated validator. */
  readonly variants: readonly string[];
}

/** Why the validators are not in use, or null when they are. */
export type ValidatorsUnavailable = { reason: "not_generated" | "schema_changed" | "load_failed"; detail: string };

/** Same relative path from src/acp/ (tests) and dist/acp/ (the daemon). */
const GENERATED = new URL("../../generated/session-update-validator.js", import.meta.url);

interface GeneratedModule {
  SCHEMA_SHA256: string;
  VALIDATORS: Record<string, Validator>;
}

async function load(): Promise<SessionUpdateValidators | ValidatorsUnavailable> {
  let generated: GeneratedModule;
  try {
    generated = (await import(GENERATED.href)) as GeneratedModule;
  } catch (error) {
    const missing = (error as { code?: unknown }).code === "ERR_MODULE_NOT_FOUND";
    return {
      reason: missing ? "not_generated" : "load_failed",
      detail: missing ? "run `npm run build`" : String(error),
    };
  }
  try {
    const schemaFile = createRequire(import.meta.url).resolve("@agentclientprotocol/sdk/schema/v1/schema.json");
    const sha256 = createHash("sha256")
      .update(await readFile(schemaFile))
      .digest("hex");
    if (sha256 !== generated.SCHEMA_SHA256) {
      return { reason: "schema_changed", detail: "the installed ACP SDK's schema.json differs; run `npm run build`" };
    }
  } catch (error) {
    return { reason: "load_failed", detail: String(error) };
  }
  const byVariant = new Map(Object.entries(generated.VALIDATORS));
  return {
    variants: [...byVariant.keys()],
    accepts(params: unknown): params is SessionNotification {
      const name = (params as { update?: { sessionUpdate?: unknown } } | null)?.update?.sessionUpdate;
      const validate = typeof name === "string" ? byVariant.get(name) : undefined;
      return validate?.(params) === true;
    },
  };
}

/**
 * Loading starts when this module is first imported (the generated file is large: its compile overlaps the
 * agent's start-up instead of the Runner's) and settles once; never rejects.
 */
export const sessionUpdateValidators: Promise<SessionUpdateValidators | ValidatorsUnavailable> = load();

export const isAvailable = (
  loaded: SessionUpdateValidators | ValidatorsUnavailable,
): loaded is SessionUpdateValidators => "accepts" in loaded;
