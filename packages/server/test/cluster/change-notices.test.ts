/**
 * Notices of changed runs (cluster/change-notices.ts): held NOTICE_DELAY_MS, then one statement in flight at a
 * time, the changes told meanwhile (each run's newest payload) going together in the next — so a notice
 * always follows a run's last change, and a burst of updates of many runs costs the state pool a few
 * statements, not one per update.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ChangeNotices, NOTICE_DELAY_MS } from "../../src/cluster/change-notices.js";
import { MAX_NOTIFICATIONS_PER_STATEMENT } from "../../src/state/engine.js";

/** A send whose calls stay open until released, in order. */
function gatedSend() {
  const sent: string[][] = [];
  const open: (() => void)[] = [];
  const send = (payloads: string[]) =>
    new Promise<void>((resolve) => {
      sent.push(payloads);
      open.push(resolve);
    });
  const releaseNext = async () => {
    open.shift()?.();
    // Let the notices' loop run to its next send (or its end).
    for (let i = 0; i < 5; i++) await Promise.resolve();
  };
  return { sent, send, releaseNext, open };
}

describe("notices of changed runs", () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it("holds the first change NOTICE_DELAY_MS, then sends what was told meanwhile, each run's newest", async () => {
    const g = gatedSend();
    const notices = new ChangeNotices(g.send, () => undefined);
    notices.tell("run-a", "run-a r1 h 1");
    notices.tell("run-b", "run-b r1 h 2");
    vi.advanceTimersByTime(NOTICE_DELAY_MS - 1);
    expect(g.sent).toEqual([]);
    notices.tell("run-a", "run-a r1 h 3");
    vi.advanceTimersByTime(1);
    expect(g.sent).toEqual([["run-a r1 h 3", "run-b r1 h 2"]]);
    await g.releaseNext();
    expect(notices.inFlight).toBe(0);
  });

  it("sends every change told while a statement is out in one more statement, each run's newest", async () => {
    const g = gatedSend();
    const notices = new ChangeNotices(g.send, () => undefined);
    notices.tell("run-a", "run-a r1 h 1");
    vi.advanceTimersByTime(NOTICE_DELAY_MS);
    notices.tell("run-a", "run-a r1 h 2");
    notices.tell("run-b", "run-b r1 h 3");
    notices.tell("run-a", "run-a r1 h 4");
    expect(g.sent).toEqual([["run-a r1 h 1"]]);
    expect(notices.inFlight).toBe(3);
    await g.releaseNext();
    expect(g.sent).toEqual([["run-a r1 h 1"], ["run-a r1 h 4", "run-b r1 h 3"]]);
    await g.releaseNext();
    expect(g.sent).toHaveLength(2);
    expect(notices.inFlight).toBe(0);
    notices.tell("run-a", "run-a r1 h 5");
    expect(g.sent).toHaveLength(2);
    vi.advanceTimersByTime(NOTICE_DELAY_MS);
    expect(g.sent.at(-1)).toEqual(["run-a r1 h 5"]);
    await g.releaseNext();
  });

  it("drops what waits when closed and sends nothing after", async () => {
    const g = gatedSend();
    const notices = new ChangeNotices(g.send, () => undefined);
    notices.tell("run-a", "run-a r1 h 1");
    notices.close();
    notices.tell("run-b", "run-b r1 h 2");
    vi.advanceTimersByTime(NOTICE_DELAY_MS * 10);
    expect(g.sent).toEqual([]);
    expect(notices.inFlight).toBe(0);
  });

  it("sends at most MAX_NOTIFICATIONS_PER_STATEMENT payloads in one statement", async () => {
    const g = gatedSend();
    const notices = new ChangeNotices(g.send, () => undefined);
    notices.tell("first", "first");
    vi.advanceTimersByTime(NOTICE_DELAY_MS);
    for (let i = 0; i <= MAX_NOTIFICATIONS_PER_STATEMENT; i++) notices.tell(`run-${i}`, `run-${i}`);
    await g.releaseNext();
    expect(g.sent[1]).toHaveLength(MAX_NOTIFICATIONS_PER_STATEMENT);
    await g.releaseNext();
    expect(g.sent[2]).toEqual([`run-${MAX_NOTIFICATIONS_PER_STATEMENT}`]);
    await g.releaseNext();
    expect(notices.inFlight).toBe(0);
  });

  it("reports a failed statement with its runs and still sends the changes told meanwhile", async () => {
    const sent: string[][] = [];
    const failures: string[] = [];
    let fail = true;
    let release: () => void = () => undefined;
    const send = (payloads: string[]) => {
      sent.push(payloads);
      if (fail) {
        fail = false;
        return new Promise<void>((_, reject) => {
          release = () => reject(new Error("state_unavailable"));
        });
      }
      return Promise.resolve();
    };
    const notices = new ChangeNotices(send, (runIds, err) =>
      failures.push(`${runIds.join(",")}: ${(err as Error).message}`),
    );
    notices.tell("run-a", "run-a 1");
    vi.advanceTimersByTime(NOTICE_DELAY_MS);
    notices.tell("run-b", "run-b 2");
    release();
    for (let i = 0; i < 10; i++) await Promise.resolve();
    expect(failures).toEqual(["run-a: state_unavailable"]);
    expect(sent).toEqual([["run-a 1"], ["run-b 2"]]);
    expect(notices.inFlight).toBe(0);
  });
});
