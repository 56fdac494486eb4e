/**
 * A hand-driven Runner connection for tests that need exact control over
 * which requests are answered and when: it speaks the protocol frame by frame,
 * answers from a FakeRunService by default, and holds requests a test chooses.
 */
import { encodeFrame, PROTOCOL_VERSION, type RunnerFrame, type RunSummary, type ServerFrame } from "@webcodex/protocol";
import WebSocket from "ws";
import { IN_PROCESS_POLL_MS, IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import type { FakeRunService } from "./fake-run-service.js";

type Request = Extract<ServerFrame, { request_id: string }>;

/**
 * The resume secret of each FakeRunService's last hello.ack: a FakeRunService stands for one Runner
 * process, so its reconnects resume its link like the real Runner's do (design §5).
 */
const resumeSecrets = new WeakMap<FakeRunService, string>();

export class RawRunner {
  readonly received: ServerFrame[] = [];
  readonly held: Request[] = [];
  /** Return true to leave a request unanswered (it lands in `held`). */
  hold: (frame: Request) => boolean = () => false;
  #ws: WebSocket;

  private constructor(
    ws: WebSocket,
    readonly svc: FakeRunService,
  ) {
    this.#ws = ws;
    ws.on("message", (data) => {
      const frame = JSON.parse(String(data)) as ServerFrame;
      this.received.push(frame);
      if (!("request_id" in frame)) return;
      if (this.hold(frame)) this.held.push(frame);
      else void this.answer(frame);
    });
  }

  static async connect(
    url: string,
    token: string,
    svc: FakeRunService,
    inventory: RunSummary[] = svc.inventory(),
    hold?: (frame: Request) => boolean,
  ): Promise<RawRunner> {
    const ws = new WebSocket(url, { headers: { authorization: `Bearer ${token}` } });
    await new Promise((resolve, reject) => {
      ws.once("open", resolve);
      ws.once("error", reject);
    });
    const r = new RawRunner(ws, svc);
    if (hold) r.hold = hold;
    const secret = resumeSecrets.get(svc);
    r.send({
      type: "hello",
      protocol_version: PROTOCOL_VERSION,
      ...svc.helloBody(),
      inventory,
      ...(secret ? { resume_secret: secret } : {}),
    });
    const ack = await poll(() => r.received.find((f) => f.type === "hello.ack"), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    if (ack.type === "hello.ack") resumeSecrets.set(svc, ack.resume_secret);
    return r;
  }

  get open(): boolean {
    return this.#ws.readyState === WebSocket.OPEN;
  }

  send(frame: RunnerFrame): void {
    this.#ws.send(encodeFrame(frame));
  }

  requests(type: Request["type"]): Request[] {
    return this.received.filter((f): f is Request => f.type === type);
  }

  /** Answer a request the way the FakeRunService would. */
  async answer(frame: Request): Promise<void> {
    const request_id = frame.request_id;
    const notFound = (run_id: string) =>
      this.send({ type: "error", request_id, code: "not_found", message: `no run ${run_id}` });
    switch (frame.type) {
      case "run.start": {
        const { type: _t, request_id: _r, ...req } = frame;
        const out = await this.svc.start(req);
        if (out.ok) this.send({ type: "run.start.result", request_id, run: out.run, created: out.created });
        else
          this.send({
            type: "error",
            request_id,
            code: out.code,
            message: out.message,
            ...(out.run ? { run: out.run } : {}),
          });
        return;
      }
      case "run.sync": {
        const s = this.svc.sync(frame.run_id, frame.after_seq, frame.max_events);
        if (!s) notFound(frame.run_id);
        else this.send({ type: "run.sync.result", request_id, ...s });
        return;
      }
      case "run.cancel": {
        const c = await this.svc.cancel(frame.run_id);
        if (!c) notFound(frame.run_id);
        else this.send({ type: "run.cancel.result", request_id, ...c });
        return;
      }
    }
  }

  /** Drop the socket without a close handshake (a crash or a network failure). */
  close(): void {
    this.#ws.terminate();
  }

  /** Close the link cleanly, as a stopping Runner does (its link lease ends at once). */
  stop(): void {
    this.#ws.close(1000, "runner stopping");
  }
}
