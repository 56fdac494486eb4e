/**
 * Identity of the managed path (design §10). Pure functions over the
 * persisted server secret:
 *
 * - `task_id`  = `wc_task_` + base32(HMAC(secret, "webcodex.agent_task.v1" ‖ principal ‖ key))[:26]
 *   (idempotent creation; the key itself is never stored).
 * - the run of an attempt: `wc_agent_run_` + base32(HMAC(secret, "webcodex.agent_task_run.v1" ‖
 *   principal ‖ task ‖ attempt))[:26] — the attempt is the run's initiation key, in its own domain, so
 *   no caller-chosen idempotency key of start_coding_agent can ever name it.
 * - `attempt_ref` = `wcatt1.` + base64url(payload) + `.` + base64url(HMAC(ref key, payload)), payload
 *   the length-prefixed (task, attempt, assignee, fence, generation). The ref key is derived from the
 *   secret for this purpose only. A ref is a compact selector for one claim, not authority: it is
 *   decoded into the same tuple callers may send explicitly, and both are checked identically.
 */
import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { base32, MAX_ATTEMPT_REF_LENGTH, RUN_ID_PREFIX } from "@webcodex/protocol";
import { canonicalJson, lengthPrefixed } from "../runs/identity.js";

export const TASK_ID_PREFIX = "wc_task_";
export const ATTEMPT_ID_PREFIX = "wc_attempt_";
// The id patterns and the attempt_ref bound are the tools' contract (the protocol package's tools/tasks.ts).
export { ATTEMPT_ID_PATTERN, MAX_ATTEMPT_REF_LENGTH, TASK_ID_PATTERN } from "@webcodex/protocol";
export const ATTEMPT_REF_PREFIX = "wcatt1.";

const TASK_DOMAIN = "webcodex.agent_task.v1";
const TASK_RUN_DOMAIN = "webcodex.agent_task_run.v1";
const REF_KEY_DOMAIN = "webcodex.attempt_ref.v1";

export interface Claim {
  task_id: string;
  attempt_id: string;
  assignee: string;
  fence: number;
  controller_generation: number;
}

function hmac26(secret: Buffer, parts: readonly string[]): string {
  return base32(createHmac("sha256", secret).update(lengthPrefixed(parts)).digest()).slice(0, 26);
}

export function deriveTaskId(secret: Buffer, principalId: string, idempotencyKey: string): string {
  return TASK_ID_PREFIX + hmac26(secret, [TASK_DOMAIN, principalId, idempotencyKey]);
}

export function deriveTaskRunId(secret: Buffer, principalId: string, taskId: string, attemptId: string): string {
  return RUN_ID_PREFIX + hmac26(secret, [TASK_RUN_DOMAIN, principalId, taskId, attemptId]);
}

export function newAttemptId(): string {
  return ATTEMPT_ID_PREFIX + base32(randomBytes(20)).slice(0, 26);
}

function sha256(value: unknown): string {
  return createHash("sha256").update(canonicalJson(value), "utf8").digest("hex");
}

/** What makes two create_agent_task calls with one key the same request. */
export function taskRequestFingerprint(input: { project_id: string; instruction: string; title: string }): string {
  return sha256({ v: 1, project_id: input.project_id, instruction: input.instruction, title: input.title });
}

/** Who was allowed to bind the run, on what: kept on the binding for inspection. */
export function authorityFingerprint(input: { principal_id: string; project_id: string; provider_id: string }): string {
  return sha256({
    v: 1,
    principal_id: input.principal_id,
    project_id: input.project_id,
    provider_id: input.provider_id,
    scopes: ["coding_agent:run", "project:write"],
  });
}

export class AttemptRefs {
  readonly #key: Buffer;

  constructor(serverSecret: Buffer) {
    this.#key = createHmac("sha256", serverSecret).update(REF_KEY_DOMAIN).digest();
  }

  issue(claim: Claim): string {
    const payload = lengthPrefixed([
      claim.task_id,
      claim.attempt_id,
      claim.assignee,
      String(claim.fence),
      String(claim.controller_generation),
    ]);
    const mac = createHmac("sha256", this.#key).update(payload).digest().subarray(0, 16);
    return `${ATTEMPT_REF_PREFIX}${payload.toString("base64url")}.${mac.toString("base64url")}`;
  }

  /** The claim a genuine ref names, or null for anything forged, truncated or malformed. */
  read(ref: string): Claim | null {
    if (ref.length > MAX_ATTEMPT_REF_LENGTH || !ref.startsWith(ATTEMPT_REF_PREFIX)) return null;
    const [body, macText, extra] = ref.slice(ATTEMPT_REF_PREFIX.length).split(".");
    if (body === undefined || macText === undefined || extra !== undefined) return null;
    const payload = Buffer.from(body, "base64url");
    const mac = Buffer.from(macText, "base64url");
    // Only the canonical encoding: no second spelling of one ref (base64url's spare low bits).
    if (payload.toString("base64url") !== body || mac.toString("base64url") !== macText) return null;
    const expected = createHmac("sha256", this.#key).update(payload).digest().subarray(0, 16);
    if (mac.byteLength !== expected.byteLength || !timingSafeEqual(mac, expected)) return null;
    const parts = splitLengthPrefixed(payload);
    if (parts?.length !== 5) return null;
    const [task_id, attempt_id, assignee, fence, generation] = parts as [string, string, string, string, string];
    if (!/^[1-9]\d{0,9}$/.test(fence) || !/^[1-9]\d{0,9}$/.test(generation)) return null;
    return { task_id, attempt_id, assignee, fence: Number(fence), controller_generation: Number(generation) };
  }
}

function splitLengthPrefixed(buf: Buffer): string[] | null {
  const out: string[] = [];
  let at = 0;
  while (at < buf.byteLength) {
    if (at + 4 > buf.byteLength) return null;
    const len = buf.readUInt32BE(at);
    at += 4;
    if (at + len > buf.byteLength) return null;
    out.push(buf.subarray(at, at + len).toString("utf8"));
    at += len;
  }
  return out;
}
