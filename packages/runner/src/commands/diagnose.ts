/**
 * `webcodex-runner diagnose --config FILE RUN_ID`: prints a run's Runner-local diagnostics file
 * (runs/diagnostics.ts), terminal-safe; exit 1 when there is none.
 */
import { RUN_ID_PATTERN, terminalSafe } from "@webcodex/protocol";
import { diagnosticsDir, readDiagnostics } from "../runs/diagnostics.js";
import { type Parsed, requireConfig, UsageError } from "./argv.js";

/** Print a run's Runner-local diagnostics: state, stage, timings, exit and the redacted agent stderr tail. */
export async function diagnose(parsed: Parsed): Promise<number> {
  const cfg = await requireConfig(parsed);
  if (parsed.positional.length !== 1) throw new UsageError("diagnose needs exactly one RUN_ID argument");
  const runId = parsed.positional[0] as string;
  if (!RUN_ID_PATTERN.test(runId))
    throw new UsageError("RUN_ID must be wc_agent_run_ followed by 26 base32 characters");
  const dir = diagnosticsDir(cfg.runner.stateDir);
  const d = readDiagnostics(dir, runId);
  if (!d) {
    process.stderr.write(`webcodex-runner: no diagnostics for ${runId} in ${dir} (never run here, or pruned)
`);
    return 1;
  }
  const t = d.timings_ms;
  const lines = [
    `run ${d.run_id}`,
    `  state: ${d.state} / ${d.execution_state}${d.failure_kind ? ` (${d.failure_kind})` : ""}${d.stop_reason ? ` stop_reason ${d.stop_reason}` : ""}`,
    `  stage: ${d.stage}`,
    `  message: ${d.message ?? "-"}`,
    `  timings (ms): spawn ${t.spawn}, initialize ${t.initialize}, session_new ${t.session_new}, config ${t.config}, barrier_commit ${t.barrier_commit}, prompt_write ${t.prompt_write}`,
    `  agent exit: ${d.exit_signal ? `signal ${d.exit_signal}` : `code ${d.exit_code ?? "-"}`}`,
    `  agent stderr: ${d.stderr_bytes} bytes, last ${Buffer.byteLength(d.stderr_tail, "utf8")} shown (redacted)`,
    "---- stderr tail ----",
    d.stderr_tail,
  ];
  // The stderr tail is the agent's own text: terminal-safe before it reaches a terminal.
  process.stdout.write(terminalSafe(`${lines.join("\n")}\n`));
  return 0;
}
