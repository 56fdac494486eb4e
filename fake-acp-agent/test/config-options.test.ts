import type { SessionConfigOption } from "@agentclientprotocol/sdk";
import { afterEach, expect, test } from "vitest";
import { cleanup, startAgent } from "./harness.js";

afterEach(cleanup);

function current(options: readonly SessionConfigOption[] | null | undefined): Record<string, unknown> {
  return Object.fromEntries((options ?? []).map((option) => [option.id, option.currentValue]));
}

test("session/new advertises the select options named by --config-options, in flag order", async () => {
  const agent = startAgent(["--config-options", "mode,model,reasoning_effort"]);
  await agent.initialize();
  const { configOptions } = await agent.newSession();
  expect(configOptions).toEqual([
    {
      type: "select",
      id: "mode",
      name: "Mode",
      category: "mode",
      currentValue: "ask",
      options: [
        { value: "ask", name: "Ask" },
        { value: "code", name: "Code" },
      ],
    },
    {
      type: "select",
      id: "model",
      name: "Model",
      category: "model",
      currentValue: "fake-small",
      options: [
        { value: "fake-small", name: "Fake small" },
        { value: "fake-large", name: "Fake large" },
      ],
    },
    {
      type: "select",
      id: "reasoning_effort",
      name: "Reasoning effort",
      category: "thought_level",
      currentValue: "medium",
      options: [
        { value: "low", name: "Low" },
        { value: "medium", name: "Medium" },
        { value: "high", name: "High" },
      ],
    },
  ]);
  await agent.stop();
});

test("session/set_config_option returns every option refreshed; model=fake-large flips mode to code", async () => {
  const agent = startAgent(["--config-options", "mode,model"]);
  const sessionId = await agent.start();
  const set = (configId: string, value: string) =>
    agent.agent.request("session/set_config_option", { sessionId, configId, value });

  expect(current((await set("mode", "ask")).configOptions)).toEqual({ mode: "ask", model: "fake-small" });
  expect(current((await set("model", "fake-large")).configOptions)).toEqual({ mode: "code", model: "fake-large" });
  expect(current((await set("mode", "ask")).configOptions)).toEqual({ mode: "ask", model: "fake-large" });
  expect(current((await set("model", "fake-small")).configOptions)).toEqual({ mode: "ask", model: "fake-small" });
  await agent.stop();
});

test("an unknown config id, an unlisted value or a boolean value is rejected with -32602", async () => {
  const agent = startAgent(["--config-options", "mode,model"]);
  const sessionId = await agent.start();
  const invalid = { code: -32602 };
  await expect(
    agent.agent.request("session/set_config_option", { sessionId, configId: "reasoning_effort", value: "high" }),
  ).rejects.toMatchObject(invalid);
  await expect(
    agent.agent.request("session/set_config_option", { sessionId, configId: "model", value: "fake-huge" }),
  ).rejects.toMatchObject(invalid);
  await expect(
    agent.agent.request("session/set_config_option", { sessionId, configId: "mode", type: "boolean", value: true }),
  ).rejects.toMatchObject(invalid);
  await agent.stop();
});

test("without --config-options session/new has no configOptions and every id is unknown", async () => {
  const agent = startAgent();
  await agent.initialize();
  const created = await agent.newSession();
  expect(created).not.toHaveProperty("configOptions");
  await expect(
    agent.agent.request("session/set_config_option", { sessionId: created.sessionId, configId: "mode", value: "ask" }),
  ).rejects.toMatchObject({ code: -32602 });
  await agent.stop();
});
