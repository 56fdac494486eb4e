/**
 * The run view (MCP App, design §15) in a real headless browser (support/browser.ts) inside a test host page
 * that implements the host side of ext-apps with its AppBridge (support/app-host.ts), against a real Server
 * child process, a real Runner and the fake ACP agent. The view's HTML is read from the Server as a host
 * reads it; the test starts each run as the model would and hands the host the tool's input and result.
 * From there the view follows the run only through the bridge, with the start result's observation token.
 * Project `ws` is a `worktree` project (design §16): there the view shows the run's recorded change, read with
 * get_coding_agent_changes as the caller. The agent resumes sessions (design §17), so a run may continue another.
 */
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { type Browser, chromium, type Frame } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type AppHost, type HostPage, readRunView, startAppHost } from "../support/app-host.js";
import { browserLaunchOptions } from "../support/browser.js";
import { ProcStack } from "../support/proc-stack.js";

/** How long the view may take to show what the run did (the fake agent's scenarios take well under a second). */
const SHOW_DEADLINE_MS = 15_000;

let stack: ProcStack;
let browser: Browser;
let host: AppHost;
let client: Client;
let html: string;
let counter = 0;
let sessions: string;

beforeAll(async () => {
  sessions = mkdtempSync(join(tmpdir(), "wc-view-sessions-"));
  stack = await new ProcStack({
    runners: [{ id: "r1", projects: ["demo", "ws"], worktreeProjects: ["ws"] }],
    server: "child",
    agentArgs: ["--continuation", "both", "--session-dir", sessions],
    agentToml: 'continuation = "both"',
  }).init();
  await stack.startRunner("r1");
  client = await stack.mcp("alice");
  html = await readRunView(client);
  host = await startAppHost();
  browser = await chromium.launch(await browserLaunchOptions());
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await host?.close();
  await stack?.stop();
  if (sessions) rmSync(sessions, { recursive: true, force: true });
});

async function start(
  prompt: string,
  extra: Record<string, unknown> = {},
): Promise<{ input: Record<string, unknown>; result: CallToolResult }> {
  const input = {
    project_id: "demo",
    provider_id: "fake",
    idempotency_key: `view-${process.pid}-${++counter}`,
    prompt,
    ...extra,
  };
  const result = (await client.callTool({ name: "start_coding_agent", arguments: input })) as CallToolResult;
  expect(result.isError).toBeFalsy();
  return { input, result };
}

async function mounted(
  prompt: string,
  width = 1024,
  dark = false,
  extra: Record<string, unknown> = {},
): Promise<{ hp: HostPage; frame: Frame; runId: string; token: string }> {
  const { input, result } = await start(prompt, extra);
  const hp = await host.open(browser, client, { width, dark });
  const frame = await hp.mount(html, input, result);
  const sc = result.structuredContent as { run_id: string; observation_token: string };
  return { hp, frame, runId: sc.run_id, token: sc.observation_token };
}

/** A phone's CSS width (an iPhone 12–15). */
const PHONE_WIDTH = 390;

/** Relative brightness 0..1 of a computed `rgb(r, g, b)` colour. */
function luminance(rgb: string): number {
  const [r = 0, g = 0, b = 0] = (rgb.match(/\d+/g) ?? []).map(Number);
  return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255;
}

const texts = (frame: Frame, selector: string) => frame.locator(selector).allTextContents();

/** Only the host page and its script were requested: the view fetched nothing. */
function expectNothingFetched(hp: HostPage): void {
  expect(hp.requests.filter((u) => !u.startsWith(`${host.origin}/`))).toEqual([]);
  expect(hp.requests.map((u) => new URL(u).pathname).sort()).toEqual(["/", "/host.js"]);
}

describe("the run view in an MCP Apps host", () => {
  it("follows a tools run through the bridge: steps in order, the changed file relative, usage and the final state", async () => {
    const { hp, frame, runId, token } = await mounted("scenario: tools");
    await expect.poll(() => frame.locator("#state").textContent(), { timeout: SHOW_DEADLINE_MS }).toBe("Completed");
    expect(await frame.locator("#run-id").textContent()).toBe(runId);
    expect(await frame.locator("#project").textContent()).toBe("demo");
    expect(await frame.locator("#provider").textContent()).toBe("fake");
    // One line per tool step, in the order the agent took them, each with its last status.
    expect(
      await frame
        .locator("#steps li")
        .evaluateAll((els) => els.map((e) => (e as unknown as { dataset: { id: string; status: string } }).dataset)),
    ).toEqual([
      { id: "call-edit-1", status: "done" },
      { id: "call-exec-1", status: "done" },
    ]);
    expect(await texts(frame, "#steps li .status")).toEqual(["done", "done"]);
    // The edited file relative to the project; the path outside it masked, never shown.
    expect(await texts(frame, "#files li")).toEqual(["src/math.js", "<outside project>"]);
    expect(await frame.locator("#usage").textContent()).toBe("1,234 of 200,000 tokens · 0.0042 USD");
    expect((await texts(frame, "#messages .message")).join("").length).toBeGreaterThan(0);
    expect(await frame.locator("#final-facts").textContent()).toBe("stop reason end_turn · recovery none");
    expect(await frame.locator("#elapsed").textContent()).toMatch(/^\d+\.\ds$/);
    expect(await frame.locator("#cancel").isHidden()).toBe(true);
    const body = (await frame.locator("body").textContent()) ?? "";
    expect(body.includes(stack.dir)).toBe(false);
    expect(body.includes("/etc/")).toBe(false);
    // It followed the run with observe_coding_agent from the start result's token, and nothing else.
    expect(hp.calls.length).toBeGreaterThan(0);
    expect(new Set(hp.calls.map((c) => c.name))).toEqual(new Set(["observe_coding_agent"]));
    expect(hp.calls[0]?.arguments).toMatchObject({ run_id: runId, after_observation_token: token });
    expectNothingFetched(hp);
    await hp.close();
  });

  it("cancels a slow run from the view only after the confirm step", async () => {
    const { hp, frame, runId } = await mounted("scenario: slow interval_ms=100 count=600");
    await expect
      .poll(async () => (await texts(frame, "#messages .message")).join(""), { timeout: SHOW_DEADLINE_MS })
      .toContain("tick 3");
    expect(await frame.locator("#state").textContent()).toBe("Running");

    // Cancel asks first; "Keep running" leaves the run alone.
    await frame.locator("#cancel-button").click();
    await expect.poll(() => frame.locator("#confirm").isVisible()).toBe(true);
    await frame.locator("#confirm-no").click();
    expect(await frame.locator("#confirm").isHidden()).toBe(true);
    const ticks = (await texts(frame, "#messages .message")).join("").length;
    await expect
      .poll(async () => (await texts(frame, "#messages .message")).join("").length, { timeout: SHOW_DEADLINE_MS })
      .toBeGreaterThan(ticks);
    expect(hp.calls.some((c) => c.name === "cancel_coding_agent")).toBe(false);
    expect(await frame.locator("#state").textContent()).toBe("Running");

    await frame.locator("#cancel-button").click();
    await frame.locator("#confirm-yes").click();
    await expect.poll(() => frame.locator("#state").textContent(), { timeout: SHOW_DEADLINE_MS }).toBe("Cancelled");
    expect(hp.calls.filter((c) => c.name === "cancel_coding_agent")).toEqual([
      { name: "cancel_coding_agent", arguments: { run_id: runId } },
    ]);
    expect(await frame.locator("#final-facts").textContent()).toContain("stop reason cancelled");
    expect(await frame.locator("#cancel").isHidden()).toBe(true);
    // The Server agrees: the run was cancelled, not merely drawn so.
    expect((await stack.untilTerminal(runId)).state).toBe("cancelled");
    expectNothingFetched(hp);
    await hp.close();
  });

  it("shows an agent message with markup and terminal escapes as inert text, readable at phone width in dark mode", async () => {
    const marker = `markupcanary${randomBytes(16).toString("hex")}`;
    const hostile =
      `<img src=x onerror='window.__pwned=1'><b id=${marker}>bold</b><script>window.__pwned=2</script>` +
      "\u001b]0;retitled\u0007\u001b[2J\u001b[1A\u001b[2K\u0008\u2714 completed \u202eevil";
    const { hp, frame } = await mounted(`scenario: hello text="${hostile}"`, PHONE_WIDTH, true);
    await expect.poll(() => frame.locator("#state").textContent(), { timeout: SHOW_DEADLINE_MS }).toBe("Completed");
    const shown = (await texts(frame, "#messages .message")).join("");
    // The markup is there as characters, and nothing of it became an element or ran.
    expect(shown).toContain(`<b id=${marker}>bold</b>`);
    expect(shown).toContain("<script>window.__pwned=2</script>");
    expect(await frame.locator(`#${marker}`).count()).toBe(0);
    expect(await frame.locator("#messages *:not(p)").count()).toBe(0);
    expect(await frame.evaluate(() => (globalThis as { __pwned?: unknown }).__pwned)).toBeUndefined();
    expect(await frame.title()).toBe("Coding agent run");
    // No raw terminal or bidi control reaches the page.
    // biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
    expect(shown).not.toMatch(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/);
    // At phone width nothing scrolls sideways, and the host's dark theme gives a dark page with light text.
    const layout = await frame.evaluate(() => {
      const d = (globalThis as unknown as { document: { documentElement: { scrollWidth: number }; body: unknown } })
        .document;
      const style = (
        globalThis as unknown as { getComputedStyle: (e: unknown) => { backgroundColor: string; color: string } }
      ).getComputedStyle(d.body);
      return { scrollWidth: d.documentElement.scrollWidth, bg: style.backgroundColor, fg: style.color };
    });
    expect(layout.scrollWidth).toBeLessThanOrEqual(PHONE_WIDTH);
    expect(luminance(layout.bg)).toBeLessThan(0.2);
    expect(luminance(layout.fg)).toBeGreaterThan(0.6);
    expectNothingFetched(hp);
    await hp.close();
  });

  it("shows a worktree run's recorded change: its files and its diff as inert text, bounded, read as the caller", async () => {
    const marker = `diffcanary${randomBytes(16).toString("hex")}`;
    // File content the agent writes: markup that would run if drawn as HTML, 1,000 lines (over one diff page).
    const hostile = `<img src=x onerror='window.__pwned=1'><b id=${marker}>bold</b><script>window.__pwned=2</script>`;
    const { hp, frame, runId } = await mounted(
      `scenario: edit_file path=src/page.html text="${hostile}" lines=1000`,
      1024,
      false,
      { project_id: "ws" },
    );
    await expect.poll(() => frame.locator("#state").textContent(), { timeout: SHOW_DEADLINE_MS }).toBe("Completed");
    await expect
      .poll(() => texts(frame, "#change-files li"), { timeout: SHOW_DEADLINE_MS })
      .toEqual(["added src/page.html+1000 −0"]);
    expect(await frame.locator("#change-note").textContent()).toBe(`On branch webcodex/run/${runId}:`);
    const diff = (await frame.locator("#diff").textContent()) ?? "";
    // The file's markup is in the diff as characters; none of it became an element or ran.
    expect(diff).toContain(`+${hostile}`);
    expect(await frame.locator(`#${marker}`).count()).toBe(0);
    expect(await frame.locator("#diff *:not(span)").count()).toBe(0);
    expect(await frame.evaluate(() => (globalThis as { __pwned?: unknown }).__pwned)).toBeUndefined();
    // Bounded: one page of the diff (the rest is named, not drawn).
    expect(diff.length).toBeLessThanOrEqual(64 * 1024);
    expect(diff.split(hostile).length - 1).toBeLessThan(1000);
    await expect(frame.locator("#diff-cut").textContent()).resolves.toBe(
      `The diff goes on: webcodex changes ${runId} --patch shows all of it.`,
    );
    // Read through the host as the caller, with the changes tool.
    expect(hp.calls.filter((c) => c.name === "get_coding_agent_changes")).toEqual([
      { name: "get_coding_agent_changes", arguments: { run_id: runId, max_bytes: 64 * 1024 } },
    ]);
    expectNothingFetched(hp);
    await hp.close();
  });

  it("shows the chain: a follow-up names the run it continues, and that run names its follow-up", async () => {
    const { result: first } = await start("scenario: hello");
    const parentId = (first.structuredContent as { run_id: string }).run_id;
    await stack.untilTerminal(parentId);
    const child = await mounted("scenario: recall", 1024, false, { continue_run_id: parentId });
    await expect
      .poll(() => child.frame.locator("#state").textContent(), { timeout: SHOW_DEADLINE_MS })
      .toBe("Completed");
    expect(await child.frame.locator("#parent-run").textContent()).toBe(parentId);
    expect(await child.frame.locator("#parent-row").isVisible()).toBe(true);
    expect(await child.frame.locator("#child-row").isHidden()).toBe(true);
    await child.hp.close();

    // The parent, rendered for an observe result: it names the run that continued it.
    const input = { run_id: parentId };
    const observed = (await client.callTool({ name: "observe_coding_agent", arguments: input })) as CallToolResult;
    const hp = await host.open(browser, client);
    const frame = await hp.mount(html, input, observed);
    await expect.poll(() => frame.locator("#child-run").textContent(), { timeout: SHOW_DEADLINE_MS }).toBe(child.runId);
    expect(await frame.locator("#child-row").isVisible()).toBe(true);
    expect(await frame.locator("#parent-row").isHidden()).toBe(true);
    // A run in the project's own tree has no change section.
    expect(await frame.locator("#change-section").isHidden()).toBe(true);
    await hp.close();
  });
});
