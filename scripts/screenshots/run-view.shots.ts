/**
 * Regenerates docs/run-view-desktop.png (1024 px wide, light: a finished `scenario: tools` run) and
 * docs/run-view-phone.png (390 px wide, dark: a live run with Cancel): the run view (MCP App) inside the
 * test host page of packages/server/test/support/app-host.ts, against a real Server child process, a Runner
 * and the fake agent. Run with `npm run screenshots`.
 */
import { join } from "node:path";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { chromium } from "playwright-core";
import { expect, it } from "vitest";
import { readRunView, startAppHost } from "../../packages/server/test/support/app-host.js";
import { browserLaunchOptions } from "../../packages/server/test/support/browser.js";
import { ProcStack } from "../../packages/server/test/support/proc-stack.js";
import { REPO_ROOT } from "../test-support/index.js";

const DOCS = join(REPO_ROOT, "docs");
/** How long the view may take to show the run before the picture is taken. */
const SHOW_DEADLINE_MS = 15_000;

it("regenerates the run view screenshots in docs/", async () => {
  const stack = await new ProcStack({ runners: [{ id: "build-01", projects: ["demo"] }], server: "child" }).init();
  const browser = await chromium.launch(await browserLaunchOptions());
  const host = await startAppHost();
  try {
    await stack.startRunner("build-01");
    const client = await stack.mcp("alice");
    const html = await readRunView(client);
    const shots = [
      {
        file: "run-view-desktop.png",
        width: 1024,
        dark: false,
        prompt: "scenario: tools",
        until: "Completed",
      },
      {
        file: "run-view-phone.png",
        width: 390,
        dark: true,
        prompt: "scenario: slow interval_ms=400 count=600",
        until: "Running",
      },
    ];
    for (const [i, shot] of shots.entries()) {
      const input = { project_id: "demo", provider_id: "fake", idempotency_key: `view-shot-${i}`, prompt: shot.prompt };
      const result = (await client.callTool({ name: "start_coding_agent", arguments: input })) as CallToolResult;
      const hp = await host.open(browser, client, { width: shot.width, height: 760, dark: shot.dark });
      const frame = await hp.mount(html, input, result);
      await expect.poll(() => frame.locator("#state").textContent(), { timeout: SHOW_DEADLINE_MS }).toBe(shot.until);
      if (shot.until === "Running") {
        await expect
          .poll(async () => (await frame.locator("#messages .message").allTextContents()).join(""), {
            timeout: SHOW_DEADLINE_MS,
          })
          .toContain("tick 4");
        await frame.locator("#cancel-button").click();
      }
      await hp.page.locator("iframe").screenshot({ path: join(DOCS, shot.file) });
      await hp.close();
      await stack.cancel("alice", { run_id: (result.structuredContent as { run_id: string }).run_id });
    }
  } finally {
    await host.close();
    await browser.close();
    await stack.stop();
  }
});
