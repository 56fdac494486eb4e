/**
 * A run's usage as the tools, the task result, the run view and the console show it: the latest ACP
 * `usage_update` its Runner reported (protocol `RunUsage`), read from the admission record's numbers.
 * Never text: token counts, a cost amount and an ISO 4217 currency code.
 */
import type { RunUsage } from "@webcodex/protocol";
import type { AdmissionRecord } from "../state/record.js";

type UsageColumns = Pick<
  AdmissionRecord,
  "usage_used_tokens" | "usage_context_size" | "usage_cost_amount" | "usage_cost_currency"
>;

/** The record's usage, or undefined when the Runner reported none. */
export function recordUsage(rec: UsageColumns): RunUsage | undefined {
  if (
    rec.usage_used_tokens === null &&
    rec.usage_context_size === null &&
    rec.usage_cost_amount === null &&
    rec.usage_cost_currency === null
  ) {
    return undefined;
  }
  return {
    used_tokens: rec.usage_used_tokens === null ? null : Number(rec.usage_used_tokens),
    context_size: rec.usage_context_size === null ? null : Number(rec.usage_context_size),
    cost_amount: rec.usage_cost_amount === null ? null : Number(rec.usage_cost_amount),
    cost_currency: rec.usage_cost_currency,
  };
}
