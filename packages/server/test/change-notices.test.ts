/**
 * Notices of changed runs (runs/change-notices.ts): at most one per run in flight, the changes told
 * meanwhile folded into one more notice after it — so a notice always follows the last change, and a
 * burst of updates costs the state pool two statements, not one per update.
 */
import { describe, expect, it } from "vitest";
import { ChangeNotices } from "../src/runs/change-notices.js";

/** A send whose calls stay open until released, in order. */
function gatedSend() {
  const sent: string[] = [];
  const open: (() => void)[] = [];
  const send = (runId: string) =>
    new Promise<void>((resolve) => {
      sent.push(runId);
      open.push(resolve);
    });
  const releaseNext = async () => {
    open.shift()?.();
    // Let the notice's loop run to its next send (or its end).
    for (let i = 0; i < 5; i++) await Promise.resolve();
  };
  return { sent, send, releaseNext, open };
}

describe("notices of changed runs", () => {
  it("sends one notice per burst of changes of a run: the first at once, one more after it for the rest", async () => {
    const g = gatedSend();
    const notices = new ChangeNotices(g.send, () => undefined);
    notices.tell("run-a", "run-a r1");
    notices.tell("run-a", "run-a r1");
    notices.tell("run-a", "run-a r1");
    notices.tell("run-b", "run-b r1");
    expect(g.sent).toEqual(["run-a", "run-b"]);
    await g.releaseNext(); // run-a's first notice has gone: one more for the two changes after it
    expect(g.sent).toEqual(["run-a", "run-b", "run-a"]);
    await g.releaseNext(); // run-b: nothing after it
    await g.releaseNext(); // run-a's second: nothing after it
    expect(g.sent).toEqual(["run-a", "run-b", "run-a"]);
    expect(notices.inFlight).toBe(0);
    notices.tell("run-a", "run-a r1");
    expect(g.sent).toEqual(["run-a", "run-b", "run-a", "run-a"]);
  });

  it("sends the folded notice with the payload of the last change told meanwhile", async () => {
    const payloads: string[] = [];
    const open: (() => void)[] = [];
    const send = (_runId: string, payload: string) =>
      new Promise<void>((resolve) => {
        payloads.push(payload);
        open.push(resolve);
      });
    const notices = new ChangeNotices(send, () => undefined);
    notices.tell("run-a", "run-a r1 h 1");
    notices.tell("run-a", "run-a r1 h 2");
    notices.tell("run-a", "run-a r1 h 3");
    open.shift()?.();
    for (let i = 0; i < 5; i++) await Promise.resolve();
    expect(payloads).toEqual(["run-a r1 h 1", "run-a r1 h 3"]);
    open.shift()?.();
    for (let i = 0; i < 5; i++) await Promise.resolve();
    expect(notices.inFlight).toBe(0);
  });

  it("reports a failed notice and still sends the one owed after it", async () => {
    const sent: string[] = [];
    const failures: string[] = [];
    let fail = true;
    let release: () => void = () => undefined;
    const send = (runId: string) => {
      sent.push(runId);
      if (fail) {
        fail = false;
        return new Promise<void>((_, reject) => {
          release = () => reject(new Error("state_unavailable"));
        });
      }
      return Promise.resolve();
    };
    const notices = new ChangeNotices(send, (runId, err) => failures.push(`${runId}: ${(err as Error).message}`));
    notices.tell("run-a", "run-a r1");
    notices.tell("run-a", "run-a r1");
    release();
    for (let i = 0; i < 10; i++) await Promise.resolve();
    expect(failures).toEqual(["run-a: state_unavailable"]);
    expect(sent).toEqual(["run-a", "run-a"]);
    expect(notices.inFlight).toBe(0);
  });
});
