/**
 * File order of `npm run test:hardening` (vitest.config.ts): the longest parts
 * first, so that with two workers the soak runs beside everything else instead
 * of starting last. Vitest's default order (its duration cache, else file
 * size) would put the soak anywhere on a fresh clone, where there is no cache.
 * Files not named here run after these, in the default order.
 */
import { basename } from "node:path";
import { BaseSequencer, type TestSpecification } from "vitest/node";

/** Longest first (measured wall times: scripts/hardening/README.md). */
export const HARDENING_ORDER = [
  "soak.full.test.ts",
  "seeded-chaos.test.ts",
  "seeded-chaos-cluster.test.ts",
  "misbehaving-agents.test.ts",
  "protocol-fuzz-runner.test.ts",
  "protocol-fuzz-server.test.ts",
  "mcp-http-fuzz.test.ts",
  "conformance.full.test.ts",
  // Last, longest first: the worker that ran the soak is free first and takes them.
  "seeded-chaos-workspaces.test.ts",
  "seeded-chaos-workspaces-run-as.test.ts",
  "seeded-chaos-webhooks.test.ts",
];

function rank(spec: TestSpecification): number {
  const i = HARDENING_ORDER.indexOf(basename(spec.moduleId));
  return i === -1 ? HARDENING_ORDER.length : i;
}

export class HardeningSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const byDefault = await super.sort(files);
    return byDefault
      .map((spec, i) => ({ spec, i, rank: rank(spec) }))
      .sort((a, b) => a.rank - b.rank || a.i - b.i)
      .map(({ spec }) => spec);
  }
}
