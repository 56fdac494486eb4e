import { describe, expect, it } from "vitest";
import { EXIT, exitCodeForState } from "../src/exit-codes.js";
import type { RunState } from "../src/wire.js";

describe("exit codes", () => {
  it.each<[RunState, number]>([
    ["completed", 0],
    ["failed", 1],
    ["lost", 3],
    ["cancelled", 130],
    ["starting", 0],
    ["running", 0],
    ["waiting_permission", 0],
  ])("a run that is %s exits %i", (state, code) => {
    expect(exitCodeForState(state)).toBe(code);
  });

  it("a run whose permission request reached its deadline exits 4, not the 130 of Ctrl-C", () => {
    expect(exitCodeForState("cancelled", "permission_timeout")).toBe(EXIT.permissionDeadline);
    expect(EXIT.permissionDeadline).toBe(4);
    expect(exitCodeForState("cancelled", null)).toBe(130);
  });

  it("a run cancelled at its own deadline exits 5, not the 130 of Ctrl-C", () => {
    expect(exitCodeForState("cancelled", "run_timeout")).toBe(EXIT.runDeadline);
    expect(EXIT.runDeadline).toBe(5);
    expect(exitCodeForState("lost", "run_timeout")).toBe(EXIT.lost);
  });

  it("keeps usage errors apart from run outcomes", () => {
    expect(EXIT.usage).toBe(2);
    expect(new Set(Object.values(EXIT)).size).toBe(Object.values(EXIT).length);
  });
});
