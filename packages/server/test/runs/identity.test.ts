import { RUN_ID_PATTERN } from "@webcodex/protocol";
import { describe, expect, it } from "vitest";
import { canonicalJson, deriveRunId, intentFingerprint, lengthPrefixed } from "../../src/runs/identity.js";
import { OBSERVATION_TOKEN_MEMO_ENTRIES, ObservationTokens } from "../../src/runs/observe-token.js";

const secret = Buffer.alloc(32, 7);

describe("run identity", () => {
  it("derives the same run id for the same principal and key, and a well-formed one", () => {
    const a = deriveRunId(secret, "alice", "key-1");
    expect(a).toMatch(RUN_ID_PATTERN);
    expect(deriveRunId(secret, "alice", "key-1")).toBe(a);
  });

  it("derives different ids for other principals, keys or secrets", () => {
    const a = deriveRunId(secret, "alice", "key-1");
    expect(deriveRunId(secret, "bob", "key-1")).not.toBe(a);
    expect(deriveRunId(secret, "alice", "key-2")).not.toBe(a);
    expect(deriveRunId(Buffer.alloc(32, 8), "alice", "key-1")).not.toBe(a);
  });

  it("concatenates unambiguously (ab|c differs from a|bc)", () => {
    expect(lengthPrefixed(["ab", "c"]).equals(lengthPrefixed(["a", "bc"]))).toBe(false);
    expect(deriveRunId(secret, "ab", "c")).not.toBe(deriveRunId(secret, "a", "bc"));
  });
});

describe("intent fingerprint", () => {
  const base = {
    project_id: "demo",
    provider_id: "fake",
    prompt: "hi",
    config: { b: "2", a: true },
    timeout_secs: null,
  };

  it("is canonical: key order does not matter", () => {
    expect(canonicalJson({ b: 1, a: { d: [1, { z: 1, y: 2 }], c: null } })).toBe(
      '{"a":{"c":null,"d":[1,{"y":2,"z":1}]},"b":1}',
    );
    expect(intentFingerprint(base)).toBe(intentFingerprint({ ...base, config: { a: true, b: "2" } }));
  });

  it.each([
    ["prompt", { prompt: "hi!" }],
    ["project", { project_id: "other" }],
    ["provider", { provider_id: "codex" }],
    ["config", { config: { a: false, b: "2" } }],
    ["timeout", { timeout_secs: 60 }],
  ])("changes with the %s", (_name, patch) => {
    expect(intentFingerprint({ ...base, ...patch })).not.toBe(intentFingerprint(base));
  });
});

describe("observation tokens", () => {
  const tokens = new ObservationTokens(secret);
  const runA = deriveRunId(secret, "alice", "a");
  const runB = deriveRunId(secret, "alice", "b");

  it("round-trips a cursor bound to its run", () => {
    const t = tokens.issue({ run_id: runA, instance: "instance_aaaaaaaaaaaa", seq: 42 });
    expect(tokens.verify(runA, t)).toEqual({ run_id: runA, instance: "instance_aaaaaaaaaaaa", seq: 42 });
  });

  it("answers the same past the memo's bound, and a remembered token stays bound to its run", () => {
    const fresh = new ObservationTokens(secret);
    const first = fresh.issue({ run_id: runA, instance: "instance_aaaaaaaaaaaa", seq: 0 });
    const sameCursorOfB = fresh.issue({ run_id: runB, instance: "instance_aaaaaaaaaaaa", seq: 0 });
    expect(sameCursorOfB).not.toBe(first);
    for (let seq = 1; seq <= OBSERVATION_TOKEN_MEMO_ENTRIES + 10; seq++) {
      fresh.issue({ run_id: runA, instance: "instance_aaaaaaaaaaaa", seq });
    }
    // `first` has been dropped from the memo: computed again, it is the same token, and still only runA's.
    expect(fresh.issue({ run_id: runA, instance: "instance_aaaaaaaaaaaa", seq: 0 })).toBe(first);
    expect(new ObservationTokens(secret).issue({ run_id: runA, instance: "instance_aaaaaaaaaaaa", seq: 0 })).toBe(
      first,
    );
    expect(fresh.verify(runA, first)).toEqual({ run_id: runA, instance: "instance_aaaaaaaaaaaa", seq: 0 });
    expect(fresh.verify(runB, first)).toBeNull();
    expect(fresh.verify(runA, sameCursorOfB)).toBeNull();
  });

  it("rejects a token presented for another run", () => {
    const t = tokens.issue({ run_id: runA, instance: "instance_aaaaaaaaaaaa", seq: 1 });
    expect(tokens.verify(runB, t)).toBeNull();
  });

  it("rejects tampered, forged and foreign-secret tokens", () => {
    const t = tokens.issue({ run_id: runA, instance: "instance_aaaaaaaaaaaa", seq: 1 });
    const [prefix, body, mac] = t.split(".");
    const forgedBody = Buffer.from("instance_aaaaaaaaaaaa.999", "utf8").toString("base64url");
    expect(tokens.verify(runA, `${prefix}.${forgedBody}.${mac}`)).toBeNull();
    expect(tokens.verify(runA, `${prefix}.${body}.${"A".repeat(mac?.length ?? 27)}`)).toBeNull();
    expect(tokens.verify(runA, "garbage")).toBeNull();
    expect(tokens.verify(runA, `${t}.x`)).toBeNull();
    expect(new ObservationTokens(Buffer.alloc(32, 9)).verify(runA, t)).toBeNull();
  });

  it("accepts exactly one spelling of a token: any other last character (or body character) is rejected", () => {
    const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    for (const seq of [0, 1, 7, 42, 123456]) {
      const t = tokens.issue({ run_id: runA, instance: "instance_aaaaaaaaaaaa", seq });
      expect(tokens.verify(runA, t)).not.toBeNull();
      for (const c of alphabet) {
        if (c === t.at(-1)) continue;
        expect(tokens.verify(runA, `${t.slice(0, -1)}${c}`), `last char ${c}`).toBeNull();
      }
      const [prefix, body = "", mac] = t.split(".");
      for (const c of alphabet) {
        if (c === body.at(-1)) continue;
        expect(tokens.verify(runA, `${prefix}.${body.slice(0, -1)}${c}.${mac}`), `body char ${c}`).toBeNull();
      }
    }
  });
});

describe("canonicalJson edge values", () => {
  it("writes undefined as null (top level and in arrays), drops undefined members, and refuses non-finite numbers", () => {
    expect(canonicalJson(undefined)).toBe("null");
    expect(canonicalJson([1, undefined, "x"])).toBe('[1,null,"x"]');
    expect(canonicalJson({ a: undefined, b: [undefined] })).toBe('{"b":[null]}');
    expect(() => canonicalJson({ n: Number.NaN })).toThrow(new TypeError("non-finite number"));
    expect(() => canonicalJson([Number.POSITIVE_INFINITY])).toThrow(TypeError);
  });
});
