/**
 * Observe's continuation links (runs/continuation.ts `ObservedLinks`): a run that is not terminal has its
 * parent read once, not once per observe; a terminal run's links are read every time, so a continuation
 * written later (by this or another instance) shows at once. On the state of the pass (SQLite or PostgreSQL).
 */
import type { RunState } from "@webcodex/protocol";
import { describe, expect, it } from "vitest";
import { ObservedLinks } from "../../src/runs/continuation.js";
import type { SqlParam, StateQueries } from "../../src/state/engine.js";
import { openTestState } from "../support/test-state.js";

const run = (c: string) => `wc_agent_run_${c.repeat(26)}`;
const PARENT = run("a");
const CHILD = run("b");
const GRANDCHILD = run("c");
const ALONE = run("d");

/** The engine, counting the statements that reach it. */
function counting(q: StateQueries): StateQueries & { reads: number } {
  const counted = {
    reads: 0,
    all<T>(sql: string, params?: readonly SqlParam[]) {
      counted.reads += 1;
      return q.all<T>(sql, params);
    },
    get: q.get.bind(q),
    run: q.run.bind(q),
    exec: q.exec.bind(q),
  };
  return counted;
}

async function link(q: StateQueries, parent: string, child: string): Promise<void> {
  await q.run("INSERT INTO run_continuations (parent_run_id, child_run_id, created_at) VALUES (?, ?, ?)", [
    parent,
    child,
    new Date().toISOString(),
  ]);
}

describe("ObservedLinks", () => {
  it("reads a running run's parent once; reads a terminal run's links every time", async () => {
    const state = await openTestState();
    await link(state.engine, PARENT, CHILD);
    const q = counting(state.engine);
    const links = new ObservedLinks();
    const running: RunState = "running";

    expect(await links.of(q, CHILD, running)).toEqual({ parent_run_id: PARENT });
    for (let i = 0; i < 5; i++) expect(await links.of(q, CHILD, running)).toEqual({ parent_run_id: PARENT });
    expect(q.reads).toBe(1);
    // A run without a parent: remembered as such.
    expect(await links.of(q, ALONE, running)).toEqual({});
    expect(await links.of(q, ALONE, running)).toEqual({});
    expect(q.reads).toBe(2);

    // Terminal: read each time, so the continuation written meanwhile shows.
    expect(await links.of(q, CHILD, "completed")).toEqual({ parent_run_id: PARENT });
    await link(state.engine, CHILD, GRANDCHILD);
    expect(await links.of(q, CHILD, "completed")).toEqual({ parent_run_id: PARENT, continued_by: GRANDCHILD });
    expect(q.reads).toBe(4);
  });
});
