/**
 * Input and output schemas of the run tools (design §6.3, §16): closed zod objects (`.strict()`) whose JSON
 * Schema is what tools/list shows, and the exact shapes of their results. They are the MCP contract, kept in the
 * protocol package (tools/runs.ts) so that the CLI reads results with the same schemas; re-exported here for the
 * run tools (runs/tools.ts).
 */
export {
  ApplyToolInput,
  ApplyToolOutput,
  CancelToolInput,
  CancelToolOutput,
  ChangesToolInput,
  ChangesToolOutput,
  ObserveToolInput,
  ObserveToolOutput,
  RunStatusFields,
  StartToolInput,
  StartToolOutput,
} from "@webcodex/protocol";
