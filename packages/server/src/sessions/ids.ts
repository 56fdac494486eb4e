/**
 * The Workflow Session id (`wc_sess_` + 26 base32 characters) as a pattern and as the zod schema every
 * tool input uses. It is the tools' contract, in the protocol package (tools/sessions.ts); re-exported here
 * for the Server's modules that name a session id without depending on Workflow Sessions themselves.
 */
export { SESSION_ID_PATTERN, SessionId } from "@webcodex/protocol";
