/**
 * CPU per `session/update` through the Runner's ACP connection (packages/runner/dist/acp/session.js): N
 * notifications of each kind written as ndjson lines into an in-memory child, timed until the last one
 * reached `onSessionUpdate`. A micro-benchmark run by hand (`npm run build && node
 * scripts/bench/session-updates.mjs`), not part of `npm run bench`; figures in docs/benchmarks.md.
 */
import { AcpClientConnection } from "../../packages/runner/dist/acp/session.js";

/** Notifications per kind and round; rounds per kind (the median is reported). */
const UPDATES = 20_000;
const ROUNDS = 5;

const KINDS = {
  tool_call: (i) => ({
    sessionUpdate: "tool_call",
    toolCallId: `call_${i}`,
    title: `Read src/file${i}.ts`,
    kind: "read",
    status: "in_progress",
    locations: [{ path: `/p/src/file${i}.ts`, line: 1 }],
  }),
  tool_call_update: (i) => ({ sessionUpdate: "tool_call_update", toolCallId: `call_${i}`, status: "completed" }),
  agent_message_chunk: (i) => ({
    sessionUpdate: "agent_message_chunk",
    content: { type: "text", text: `chunk ${i} of the agent's answer, about thirty-two` },
  }),
};

function fakeChild() {
  let out;
  const stdout = new ReadableStream({
    start(controller) {
      out = controller;
    },
  });
  const child = {
    pid: 0,
    pgid: 0,
    startTime: null,
    stdout,
    stdin: new WritableStream({ write() {} }),
    exited: new Promise(() => {}),
    exit: null,
    stderrBytes: 0,
    stderrTail: () => "",
    terminateTree: async () => ({ escalation: "eof", survivors: 0 }),
  };
  return { child, write: (bytes) => out.enqueue(bytes) };
}

async function round(kind) {
  const { child, write } = fakeChild();
  const encoder = new TextEncoder();
  const make = KINDS[kind];
  const payload = encoder.encode(
    Array.from(
      { length: UPDATES },
      (_, i) =>
        `${JSON.stringify({ jsonrpc: "2.0", method: "session/update", params: { sessionId: "s1", update: make(i) } })}\n`,
    ).join(""),
  );
  let seen = 0;
  let done;
  const all = new Promise((resolve) => (done = resolve));
  const conn = new AcpClientConnection(child, {
    onSessionUpdate: () => {
      if (++seen === UPDATES) done();
    },
    onPermissionRequest: async () => ({ outcome: { outcome: "cancelled" } }),
    onUnsupportedRequest: () => {},
  });
  const cpu = process.cpuUsage();
  const t0 = performance.now();
  write(payload);
  await all;
  const wall = performance.now() - t0;
  const used = process.cpuUsage(cpu);
  conn.close();
  return { wallUs: (wall * 1000) / UPDATES, cpuUs: (used.user + used.system) / UPDATES };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
await round("tool_call"); // warm-up
for (const kind of Object.keys(KINDS)) {
  const rounds = [];
  for (let r = 0; r < ROUNDS; r++) rounds.push(await round(kind));
  const cpu = median(rounds.map((r) => r.cpuUs)).toFixed(1);
  const wall = median(rounds.map((r) => r.wallUs)).toFixed(1);
  console.log(
    `${kind.padEnd(20)} ${cpu.padStart(6)} µs CPU / update, ${wall.padStart(6)} µs wall (median of ${ROUNDS} × ${UPDATES})`,
  );
}
