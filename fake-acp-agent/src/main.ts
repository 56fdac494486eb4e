import { writeFileSync } from "node:fs";
import { Readable } from "node:stream";
import { ndJsonStream } from "@agentclientprotocol/sdk";
import { buildAgent } from "./agent.js";
import { type AgentOptions, parseCli, UsageError } from "./args.js";
import { Ledger } from "./ledger.js";
import { Lifecycle } from "./lifecycle.js";
import { StdoutSink } from "./output.js";
import { tapPrompts } from "./prompt-tap.js";

function options(): AgentOptions {
  try {
    return parseCli(process.argv.slice(2), process.env);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    console.error(`fake-acp-agent: ${error.message}`);
    process.exit(2);
  }
}

const opts = options();
if (opts.envNamesFile !== undefined) {
  writeFileSync(opts.envNamesFile, `${JSON.stringify(Object.keys(process.env).sort())}\n`);
}

const life = new Lifecycle();
const out = new StdoutSink();
// A vanished reader (EPIPE) ends the agent like stdin EOF does.
process.stdout.on("error", () => {
  if (!life.heldOpen) process.exit(0);
});

const input = Readable.toWeb(process.stdin) as ReadableStream<Uint8Array>;
const ledger = new Ledger(opts.ledgerFile);
const stream = tapPrompts(out.observe(ndJsonStream(out.bytes, input)), ledger);
const connection = buildAgent({ options: opts, ledger, out, life }).connect(stream);

void connection.closed.then(() => {
  if (!life.heldOpen) process.exit(0);
});
