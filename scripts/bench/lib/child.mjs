/** Node helper children of the bench (sim runners, observers) that talk in JSON lines on stdout. */
import { openSync } from "node:fs";
import { createInterface } from "node:readline";
import { spawnTracked } from "./proc.mjs";

/** Spawn `node script ...args`; stderr goes to logFile. Returns the handle plus a queue of parsed stdout lines. */
export function spawnJsonChild(script, args, { logFile, nodeArgs = [] } = {}) {
  const err = logFile ? openSync(logFile, "a") : "ignore";
  const handle = spawnTracked(process.execPath, [...nodeArgs, script, ...args], { stdio: ["ignore", "pipe", err] });
  const lines = [];
  const waiters = new Set();
  createInterface({ input: handle.child.stdout }).on("line", (line) => {
    try {
      lines.push(JSON.parse(line));
    } catch {
      return;
    }
    for (const w of [...waiters]) w();
  });
  /** Resolves with the first line matching `pred` (within timeoutMs), or rejects. */
  const waitLine = (pred, timeoutMs) =>
    new Promise((resolve, reject) => {
      const check = () => {
        const hit = lines.find(pred);
        if (hit) {
          cleanup();
          resolve(hit);
        }
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(new Error(`${script}: no expected output within ${timeoutMs} ms`));
      }, timeoutMs);
      const onExit = () => {
        check();
        cleanup();
        reject(new Error(`${script}: exited before the expected output`));
      };
      const cleanup = () => {
        clearTimeout(timer);
        waiters.delete(check);
        handle.child.off("close", onExit);
      };
      waiters.add(check);
      handle.child.once("close", onExit);
      check();
    });
  return { ...handle, lines, waitLine };
}
