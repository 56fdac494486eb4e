/**
 * CPU per `session/update` through the Runner's ACP connection (packages/runner/dist/acp/session.js) and, in
 * the same process, through a bare SDK client (`client().onNotification("session/update")` over the same
 * ndJsonStream: the SDK's own path, which parses each update twice): N notifications of each kind written as
 * ndjson lines into an in-memory child, timed until the last one reached the handler. Rounds alternate
 * between the two. A micro-benchmark run by hand (`npm run build && node scripts/bench/session-updates.mjs`),
 * not part of `npm run bench`; figures in docs/benchmarks.md. The first line says whether the Runner's
 * generated validators (acp/session-update-validator.ts) were in use.
 */
import { client, ndJsonStream } from "@agentclientprotocol/sdk";
import { AcpClientConnection } from "../../packages/runner/dist/acp/session.js";
import { isAvailable, sessionUpdateValidators } from "../../packages/runner/dist/acp/session-update-validator.js";

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

/** The Runner's connection, or a bare SDK client on the same streams; returns its close(). */
const PATHS = {
  runner: (child, onUpdate) => {
    const conn = new AcpClientConnection(child, {
      onSessionUpdate: onUpdate,
      onPermissionRequest: async () => ({ outcome: { outcome: "cancelled" } }),
      onUnsupportedRequest: () => {},
    });
    return () => conn.close();
  },
  sdk: (child, onUpdate) => {
    const connection = client({ name: "bench" })
      .onNotification("session/update", (ctx) => onUpdate(ctx.params))
      .connect(ndJsonStream(child.stdin, child.stdout));
    return () => connection.close();
  },
};

async function round(kind, path) {
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
  const close = PATHS[path](child, () => {
    if (++seen === UPDATES) done();
  });
  const cpu = process.cpuUsage();
  const t0 = performance.now();
  write(payload);
  await all;
  const wall = performance.now() - t0;
  const used = process.cpuUsage(cpu);
  close();
  return { wallUs: (wall * 1000) / UPDATES, cpuUs: (used.user + used.system) / UPDATES };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const loaded = await sessionUpdateValidators;
console.log(
  isAvailable(loaded)
    ? `runner: generated validators for ${loaded.variants.length} variants`
    : `runner: SDK path only (${loaded.reason}: ${loaded.detail})`,
);
for (const path of Object.keys(PATHS)) await round("tool_call", path); // warm-up
for (const kind of Object.keys(KINDS)) {
  const rounds = { runner: [], sdk: [] };
  for (let r = 0; r < ROUNDS; r++) for (const path of Object.keys(PATHS)) rounds[path].push(await round(kind, path));
  for (const path of Object.keys(PATHS)) {
    const cpu = median(rounds[path].map((r) => r.cpuUs)).toFixed(1);
    const wall = median(rounds[path].map((r) => r.wallUs)).toFixed(1);
    console.log(
      `${kind.padEnd(20)} ${path.padEnd(6)} ${cpu.padStart(6)} µs CPU / update, ${wall.padStart(6)} µs wall (median of ${ROUNDS} × ${UPDATES})`,
    );
  }
}
