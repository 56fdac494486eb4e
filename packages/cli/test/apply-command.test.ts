import { APPLY_TIMEOUT_MS } from "@webcodex/protocol";
import { describe, expect, it } from "vitest";
import { runCli } from "../src/cli.js";
import { APPLY_ANSWER_MARGIN_MS } from "../src/commands/apply.js";
import { loadRecorded, scriptedClient, testContext } from "./support.js";

const RUN = loadRecorded("tools-run").start.run_id;
const HEAD = "a".repeat(40);
const BEFORE = "b".repeat(40);

describe("webcodex apply", () => {
  it("waits for the Server's whole bound on the Runner's apply, not the CLI's default request bound", async () => {
    const seen: { name: string; args: Record<string, unknown>; timeoutMs: number | undefined }[] = [];
    const client = {
      ...scriptedClient(loadRecorded("tools-run")),
      async callTool(
        name: string,
        args: Record<string, unknown>,
        schema: { parse(v: unknown): unknown },
        timeoutMs?: number,
      ) {
        seen.push({ name, args, timeoutMs });
        return schema.parse({
          run_id: RUN,
          target_branch: "main",
          result: "fast_forward",
          applied: true,
          head_commit: HEAD,
          target_before: BEFORE,
          target_after: HEAD,
        });
      },
    };
    const { ctx, stdout } = testContext(client as never);
    expect(await runCli(["apply", RUN, "--to", "main", "--key", "k1"], ctx)).toBe(0);
    expect(seen).toEqual([
      {
        name: "apply_coding_agent_changes",
        args: { run_id: RUN, target_branch: "main", idempotency_key: "k1" },
        timeoutMs: APPLY_TIMEOUT_MS + APPLY_ANSWER_MARGIN_MS,
      },
    ]);
    expect(seen[0]!.timeoutMs).toBeGreaterThan(APPLY_TIMEOUT_MS);
    expect(stdout.text).toContain("main fast-forwarded to aaaaaaa");
  });
});
