/**
 * The shapes the CLI reads from the workspace tools (design §16): the protocol package's output schemas
 * (`tools/changes.ts`, `tools/apply.ts`), read tolerantly (tolerant.ts).
 */
import { ApplyToolOutput, ChangesToolOutput } from "@webcodex/protocol";
import type { z } from "zod";
import { readAs } from "./tolerant.js";

export const ChangesResult = readAs(ChangesToolOutput);
export type ChangesResult = z.infer<typeof ChangesResult>;

export const ApplyResult = readAs(ApplyToolOutput);
export type ApplyResult = z.infer<typeof ApplyResult>;
