/**
 * The Workflow Session id (`wc_sess_` + 26 base32 characters) as a pattern and as the zod schema every
 * tool input uses. Kept apart from the service so that the run tools, the task tools and the audit can
 * name a session id without depending on Workflow Sessions themselves.
 */
import { z } from "zod";

export const SESSION_ID_PATTERN = /^wc_sess_[a-z2-7]{26}$/;

export const SessionId = z.string().regex(SESSION_ID_PATTERN, "must be wc_sess_ followed by 26 base32 characters");
