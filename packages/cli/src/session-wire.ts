/**
 * The shapes the CLI reads from the workflow-session tools (design §11): the protocol package's output schemas
 * (`tools/sessions.ts`), which the Server's session tools write their results with, read tolerantly
 * (tolerant.ts). The CLI does not read the timestamps of a session nor an entry's provider and execution state.
 */
import { ReadSessionOutput, SessionEvidence, SessionView } from "@webcodex/protocol";
import { z } from "zod";
import { readAs } from "./tolerant.js";

const NOT_READ = { created_at: true, updated_at: true } as const;

export const SessionResult = readAs(SessionView.omit(NOT_READ));
export type SessionResult = z.infer<typeof SessionResult>;

export const SessionRead = readAs(
  ReadSessionOutput.omit(NOT_READ).extend({
    evidence: z.array(SessionEvidence.omit({ provider_id: true, execution_state: true })),
  }),
);
export type SessionRead = z.infer<typeof SessionRead>;
