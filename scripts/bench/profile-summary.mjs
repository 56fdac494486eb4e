#!/usr/bin/env node
/**
 * Summarize a V8 .cpuprofile (from `node --cpu-prof`, e.g. `npm run bench -- --profile`):
 * top functions by self time, and self time per file/package.
 *   node scripts/bench/profile-summary.mjs FILE.cpuprofile [--top 25]
 */
import { readFileSync } from "node:fs";

const file = process.argv[2];
const topIndex = process.argv.indexOf("--top");
const top = topIndex > 0 ? Number(process.argv[topIndex + 1]) : 25;
if (!file) {
  console.error("usage: profile-summary.mjs FILE.cpuprofile [--top N]");
  process.exit(2);
}
const profile = JSON.parse(readFileSync(file, "utf8"));
const byId = new Map(profile.nodes.map((n) => [n.id, n]));
const selfUs = new Map();
const deltas = profile.timeDeltas;
for (let i = 0; i < profile.samples.length; i++) {
  const id = profile.samples[i];
  selfUs.set(id, (selfUs.get(id) ?? 0) + (deltas[i] ?? 0));
}
const total = [...selfUs.values()].reduce((a, b) => a + b, 0);
const fn = new Map();
const files = new Map();
for (const [id, us] of selfUs) {
  const { callFrame } = byId.get(id);
  const url = callFrame.url.replace(/^file:\/\//, "").replace(/.*node_modules\//, "nm:");
  const key = `${callFrame.functionName || "(anonymous)"}  ${url}:${callFrame.lineNumber + 1}`;
  fn.set(key, (fn.get(key) ?? 0) + us);
  const pkg = url.startsWith("nm:")
    ? url
        .split("/")
        .slice(0, url.startsWith("nm:@") ? 2 : 1)
        .join("/")
    : url.replace(/.*\/(packages\/[^/]+|fake-acp-agent)\/.*/, "$1") || `(${callFrame.functionName || "native"})`;
  files.set(pkg, (files.get(pkg) ?? 0) + us);
}
// Inclusive time of named functions (--inclusive name1,name2): self time of the node and all its descendants.
const incIndex = process.argv.indexOf("--inclusive");
const inclusiveNames = incIndex > 0 ? process.argv[incIndex + 1].split(",") : [];
const children = new Map(profile.nodes.map((n) => [n.id, n.children ?? []]));
function subtree(id, seen = new Set()) {
  if (seen.has(id)) return 0;
  seen.add(id);
  let us = selfUs.get(id) ?? 0;
  for (const c of children.get(id) ?? []) us += subtree(c, seen);
  return us;
}
const inclusive = new Map();
for (const name of inclusiveNames) {
  const seen = new Set();
  let us = 0;
  // Outermost matches only: a node is counted once even under a recursive match.
  const visit = (id, inside) => {
    const node = byId.get(id);
    const match = !inside && node.callFrame.functionName === name;
    if (match) us += subtree(id, seen);
    for (const c of children.get(id) ?? []) visit(c, inside || match);
  };
  visit(profile.nodes[0].id, false);
  inclusive.set(name, us);
}
const pct = (us) => `${((100 * us) / total).toFixed(1).padStart(5)}%`;
console.log(`${file}: ${(total / 1000).toFixed(0)} ms sampled`);
console.log("\nself time by package/file:");
for (const [k, us] of [...files].sort((a, b) => b[1] - a[1]).slice(0, 15)) console.log(`  ${pct(us)}  ${k}`);
if (inclusive.size) {
  console.log("\ninclusive time:");
  for (const [k, us] of inclusive) console.log(`  ${pct(us)}  ${(us / 1000).toFixed(0).padStart(7)} ms  ${k}`);
}
console.log(`\ntop ${top} functions by self time:`);
for (const [k, us] of [...fn].sort((a, b) => b[1] - a[1]).slice(0, top)) console.log(`  ${pct(us)}  ${k}`);
