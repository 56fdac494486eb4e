/**
 * Turns Stryker's JSON report into `bench-results/mutation.json`: the mutation
 * score per module of the scope, with every surviving (or uncovered) mutant
 * listed by file, line and mutator so each can be killed or explained in
 * scripts/mutation/mutation-report.md.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { SCOPE } from "./scope.mjs";

const ROOT = resolve(fileURLToPath(new URL("../..", import.meta.url)));
const SOURCE = join(ROOT, "bench-results/mutation-stryker.json");
const TARGET = join(ROOT, "bench-results/mutation.json");

const report = JSON.parse(readFileSync(SOURCE, "utf8"));
const modules = SCOPE.map(({ module, file }) => {
  const entry = Object.entries(report.files).find(([path]) => path.endsWith(file));
  const mutants = entry ? entry[1].mutants : [];
  const count = (status) => mutants.filter((m) => m.status === status).length;
  const killed = count("Killed");
  const timeout = count("Timeout");
  const survived = count("Survived");
  const noCoverage = count("NoCoverage");
  const valid = killed + timeout + survived + noCoverage;
  return {
    module,
    file,
    mutants: mutants.length,
    killed,
    timeout,
    survived,
    no_coverage: noCoverage,
    compile_errors: count("CompileError"),
    score: valid === 0 ? null : Math.round(((killed + timeout) / valid) * 10_000) / 100,
    survivors: mutants
      .filter((m) => m.status === "Survived" || m.status === "NoCoverage")
      .map((m) => ({
        line: m.location.start.line,
        mutator: m.mutatorName,
        replacement: m.replacement ?? null,
        status: m.status,
      })),
  };
});
const totals = modules.reduce(
  (t, m) => ({
    killed: t.killed + m.killed + m.timeout,
    valid: t.valid + m.killed + m.timeout + m.survived + m.no_coverage,
  }),
  { killed: 0, valid: 0 },
);
const out = {
  generated_at: new Date().toISOString(),
  score: totals.valid === 0 ? null : Math.round((totals.killed / totals.valid) * 10_000) / 100,
  modules,
};
writeFileSync(TARGET, `${JSON.stringify(out, null, 2)}\n`);
for (const m of modules) {
  process.stdout.write(
    `${m.module.padEnd(32)} ${String(m.score ?? "-").padStart(6)}%  killed ${m.killed + m.timeout}/${m.mutants - m.compile_errors}  survived ${m.survived}  no-coverage ${m.no_coverage}\n`,
  );
}
process.stdout.write(`total ${out.score}% → ${TARGET}\n`);
