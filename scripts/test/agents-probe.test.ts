/**
 * The opt-in agents probe's own logic (scripts/agents-lib.mjs), offline and without installing anything:
 * the snapshot entry a probe result becomes, the diff against the committed snapshot that makes a
 * version bump visible, and the committed snapshot covering every pinned agent.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import {
  AGENTS,
  authKind,
  diffSnapshots,
  formatDiff,
  snapshotEntry,
  sortKeys,
  // @ts-expect-error plain .mjs scripts without type declarations
} from "../agents-lib.mjs";
import { REPO_ROOT } from "../test-support/index.js";

const AGENT = { id: "demo", pkg: "demo-acp", version: "1.2.3" };
const INIT = {
  protocolVersion: 1,
  agentInfo: { name: "demo-acp", version: "1.2.3" },
  agentCapabilities: { loadSession: true, sessionCapabilities: { resume: {} } },
  authMethods: [
    { id: "login", name: "Log in", _meta: { "terminal-auth": { command: "demo", args: ["login"] } } },
    { id: "key", name: "API key" },
  ],
};
const SESSION = {
  sessionId: "s1",
  modes: { currentModeId: "build", availableModes: [{ id: "build" }, { id: "plan" }] },
  configOptions: [
    {
      id: "mode",
      type: "select",
      category: "mode",
      currentValue: "build",
      options: [{ value: "build" }, { value: "plan" }],
    },
    { id: "model", type: "select", category: "model", currentValue: "m1", options: [{ value: "m1" }, { value: "m2" }] },
  ],
  models: { currentModelId: "m1", availableModels: [] },
};
const VERDICT = { known: null, mode: { kind: "option", optionId: "mode", value: "build", forced: true }, warnings: [] };

function probed() {
  return snapshotEntry(AGENT, {
    status: "probed",
    probe: { ok: true, initialize: INIT, session: SESSION, forced: { ok: true, effective: [] } },
    verdict: VERDICT,
  });
}

describe("agents probe: snapshot entries", () => {
  it("records capabilities, auth methods by kind, modes, non-model options with values, and the verdict; never model lists", () => {
    const entry = probed();
    expect(entry).toMatchObject({
      package: "demo-acp",
      version: "1.2.3",
      status: "ok",
      agentCapabilities: { loadSession: true, sessionCapabilities: { resume: {} } },
      authMethods: [
        { id: "login", kind: "terminal login" },
        { id: "key", kind: "authenticate" },
      ],
      session: {
        modes: { current: "build", available: ["build", "plan"] },
        configOptions: [
          { id: "mode", current: "build", values: ["build", "plan"] },
          { id: "model", type: "select", category: "model" },
        ],
        models: "advertised",
      },
      forced: "applied",
      verdict: { mode: "build (config option mode, forced)", warnings: [] },
    });
    expect(JSON.stringify(entry)).not.toContain("m2");
  });

  it("session/new refused with auth_required keeps what initialize advertised", () => {
    const entry = snapshotEntry(AGENT, {
      status: "probed",
      probe: { ok: false, stage: "session_new", reason: "…", initialize: INIT, authRequired: true },
      verdict: null,
    });
    expect(entry).toMatchObject({
      status: "auth_required",
      stage: "session_new",
      authMethods: [{ id: "login" }, { id: "key" }],
    });
    expect(entry).not.toHaveProperty("session");
  });

  it("an agent the registry cannot install is a verdict, with the reason", () => {
    expect(snapshotEntry(AGENT, { status: "not_installable", why: "no platform package" })).toEqual({
      package: "demo-acp",
      version: "1.2.3",
      status: "not_installable",
      why: "no platform package",
    });
  });

  it("an auth method's kind: ACP type terminal and the _meta hints are terminal logins, the rest authenticate", () => {
    expect(authKind({ id: "a", name: "a", type: "terminal" })).toBe("terminal login");
    expect(authKind({ id: "a", name: "a", _meta: { type: "terminal", args: ["--x"] } })).toBe("terminal login");
    expect(authKind({ id: "a", name: "a", _meta: { "api-key": {} } })).toBe("authenticate");
  });
});

describe("agents probe: the diff against the committed snapshot", () => {
  it("the same surface (keys in any order) is no difference", () => {
    const entry = probed();
    const reordered = JSON.parse(JSON.stringify(sortKeys(entry)));
    expect(diffSnapshots({ demo: reordered }, { demo: entry }, ["demo"])).toEqual([]);
  });

  it("a version bump that drops resume and adds a mode shows each changed path, old and new", () => {
    const expected = { demo: sortKeys(probed()) };
    const bumped = sortKeys(probed());
    bumped.version = "1.3.0";
    bumped.agentCapabilities = { loadSession: true };
    bumped.session.modes.available = ["build", "plan", "yolo"];
    const diffs = diffSnapshots(expected, { demo: bumped }, ["demo"]);
    expect(diffs.map((d: { path: string }) => d.path)).toEqual([
      "demo.agentCapabilities.sessionCapabilities.resume",
      "demo.session.modes.available",
      "demo.version",
    ]);
    const text = formatDiff(diffs);
    expect(text).toContain('- demo.version: "1.2.3"\n+ demo.version: "1.3.0"');
    expect(text).toContain("- demo.agentCapabilities.sessionCapabilities.resume: {}");
    expect(text).not.toContain("+ demo.agentCapabilities.sessionCapabilities");
    expect(text).toContain('+ demo.session.modes.available: ["build","plan","yolo"]');
  });

  it("an agent probed but not in the snapshot, or gone from the probe, is a difference; agents not probed are not compared", () => {
    expect(diffSnapshots({}, { demo: probed() }, ["demo"])).toEqual([
      { path: "demo", expected: undefined, actual: "(probed)" },
    ]);
    expect(diffSnapshots({ other: probed() }, { demo: sortKeys(probed()) }, ["demo"])).toHaveLength(1);
    expect(diffSnapshots({ demo: probed(), other: probed() }, { demo: probed() }, ["demo"])).toEqual([]);
  });

  it("the committed snapshot has an entry for every pinned agent, at its pinned version", () => {
    const snapshot = JSON.parse(readFileSync(join(REPO_ROOT, "docs", "agents", "capabilities.json"), "utf8"));
    for (const agent of AGENTS) {
      expect(snapshot[agent.id], agent.id).toMatchObject({ package: agent.pkg, version: agent.version });
    }
    expect(Object.keys(snapshot).sort()).toEqual(AGENTS.map((a: { id: string }) => a.id).sort());
  });
});
