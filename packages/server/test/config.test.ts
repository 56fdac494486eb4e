import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { REPO_ROOT, SERVER_BIN } from "../../../scripts/test-support/index.js";
import { buildServerConfig, ConfigError, parseServerConfig, sha256Hex } from "../src/config.js";
import {
  DEFAULT_WEBHOOK_DISABLE_AFTER_FAILURES,
  DEFAULT_WEBHOOK_DISABLE_AFTER_SECS,
  MAX_RUNNERS,
  MAX_WEBHOOK_DISABLE_AFTER_FAILURES,
  MAX_WEBHOOK_DISABLE_AFTER_SECS,
} from "../src/config-file.js";

const HASH = sha256Hex("t");
const base = (extra: Record<string, unknown> = {}) => ({
  server: { port: 0, state_dir: "s" },
  runners: [{ id: "r1", token_sha256: HASH, projects: ["demo"] }],
  ...extra,
});

describe("server config", () => {
  it("resolves state_dir against the config directory and binds projects to runners", () => {
    const c = buildServerConfig(base(), { file: "/etc/wc/server.toml", baseDir: "/etc/wc" });
    expect(c.stateDir).toBe("/etc/wc/s");
    expect(c.projectRunner.get("demo")).toBe("r1");
    expect(c.runners[0]?.tokenHash.toString("hex")).toBe(HASH);
  });

  it("reads [server] allowed_origins (empty by default) and rejects anything that is not an origin", () => {
    expect(buildServerConfig(base(), { file: null, baseDir: "/" }).allowedOrigins).toEqual([]);
    const c = buildServerConfig(base({ server: { port: 0, allowed_origins: ["https://app.example"] } }), {
      file: null,
      baseDir: "/",
    });
    expect(c.allowedOrigins).toEqual(["https://app.example"]);
    for (const bad of ["https://app.example/", "app.example", "https://app.example/path", "*"]) {
      expect(() =>
        buildServerConfig(base({ server: { port: 0, allowed_origins: [bad] } }), { file: null, baseDir: "/" }),
      ).toThrow(ConfigError);
    }
  });

  it("reads [server.webhooks] disable_after_failures and disable_after_secs (5 days by default) and refuses out-of-range ones by name", () => {
    const at = { file: null, baseDir: "/" };
    expect(buildServerConfig(base(), at).webhooks).toMatchObject({
      disableAfterFailures: DEFAULT_WEBHOOK_DISABLE_AFTER_FAILURES,
      disableAfterMs: DEFAULT_WEBHOOK_DISABLE_AFTER_SECS * 1000,
    });
    const set = (webhooks: Record<string, unknown>) => base({ server: { port: 0, state_dir: "s", webhooks } });
    expect(buildServerConfig(set({ disable_after_failures: 3, disable_after_secs: 0 }), at).webhooks).toMatchObject({
      disableAfterFailures: 3,
      disableAfterMs: 0,
    });
    for (const [key, bad] of [
      ["disable_after_failures", 0],
      ["disable_after_failures", MAX_WEBHOOK_DISABLE_AFTER_FAILURES + 1],
      ["disable_after_secs", -1],
      ["disable_after_secs", MAX_WEBHOOK_DISABLE_AFTER_SECS + 1],
    ] as const) {
      expect(() => buildServerConfig(set({ [key]: bad }), at), `${key} = ${bad}`).toThrow(key);
    }
  });

  it("reads [server.cluster] advertise_url, refuses one with a path, and requires it for 0.0.0.0 on PostgreSQL", () => {
    const opts = { file: null, baseDir: "/" };
    const pgServer = (host: string, cluster?: Record<string, unknown>) =>
      base({
        server: {
          port: 0,
          host,
          allow_insecure_http: true,
          state: { backend: "postgres" },
          ...(cluster ? { cluster } : {}),
        },
      });
    const flags = { onClientListener: false, allowInsecureTransport: false };
    expect(buildServerConfig(base(), opts).cluster).toEqual({ advertiseUrl: null, listen: null, ...flags });
    // PostgreSQL: the instances' own listener by default, on a free port.
    expect(buildServerConfig(pgServer("127.0.0.1"), opts).cluster).toEqual({
      advertiseUrl: null,
      listen: { host: "127.0.0.1", port: 0 },
      ...flags,
    });
    const advertised = { advertise_url: "https://10.0.0.5:7421", listen_port: 7421 };
    expect(buildServerConfig(pgServer("0.0.0.0", advertised), opts).cluster).toEqual({
      advertiseUrl: "https://10.0.0.5:7421",
      listen: { host: "0.0.0.0", port: 7421 },
      ...flags,
    });
    expect(() => buildServerConfig(pgServer("0.0.0.0"), opts)).toThrow(
      /server\.cluster\.advertise_url: required when the listener of server\.cluster is "0\.0\.0\.0"/,
    );
    for (const bad of ["http://10.0.0.5:7420/x", "ftp://h", "10.0.0.5:7420", "http://h?q"]) {
      expect(() => buildServerConfig(pgServer("127.0.0.1", { advertise_url: bad }), opts)).toThrow(
        /server\.cluster\.advertise_url/,
      );
    }
  });

  it("serves /_wc/ on the clients' listener only by serve_on_client_listener, and advertise_url names a fixed port", () => {
    const opts = { file: null, baseDir: "/" };
    const pg = (cluster: Record<string, unknown>, host = "127.0.0.1") =>
      base({ server: { port: 7420, host, allow_insecure_http: true, state: { backend: "postgres" }, cluster } });
    expect(buildServerConfig(pg({ serve_on_client_listener: true }), opts).cluster).toEqual({
      advertiseUrl: null,
      listen: null,
      onClientListener: true,
      allowInsecureTransport: false,
    });
    expect(() => buildServerConfig(pg({ serve_on_client_listener: true, listen_port: 7421 }), opts)).toThrow(
      /server\.cluster\.serve_on_client_listener: true serves \/_wc\/ on the clients' listener; remove listen_port/,
    );
    // An advertise_url cannot name a free port chosen at start.
    expect(() => buildServerConfig(pg({ advertise_url: "http://127.0.0.1:7421" }), opts)).toThrow(
      /server\.cluster\.listen_port: required with advertise_url/,
    );
    expect(
      buildServerConfig(pg({ advertise_url: "http://127.0.0.1:7420", serve_on_client_listener: true }), opts).cluster
        .onClientListener,
    ).toBe(true);
  });

  it("refuses plain http:// between instances on a non-loopback address unless allow_insecure_transport", () => {
    const opts = { file: null, baseDir: "/" };
    const pg = (cluster: Record<string, unknown>, host = "127.0.0.1") =>
      base({ server: { port: 7420, host, allow_insecure_http: true, state: { backend: "postgres" }, cluster } });
    for (const cluster of [{ advertise_url: "http://10.0.0.5:7421", listen_port: 7421 }, { listen_host: "10.0.0.5" }]) {
      expect(() => buildServerConfig(pg(cluster), opts)).toThrow(
        /server\.cluster: the other instances would reach this one over plain http:\/\/ at "10\.0\.0\.5".*allow_insecure_transport = true/,
      );
      expect(
        buildServerConfig(pg({ ...cluster, allow_insecure_transport: true }), opts).cluster.allowInsecureTransport,
      ).toBe(true);
    }
    // https, or loopback: no opt-in needed.
    expect(() =>
      buildServerConfig(pg({ advertise_url: "https://10.0.0.5:7421", listen_port: 7421 }), opts),
    ).not.toThrow();
    expect(() => buildServerConfig(pg({ listen_host: "127.0.0.2" }), opts)).not.toThrow();
  });

  it("reads [server.cluster] listen_port and listen_host, and refuses them where they cannot work", () => {
    const opts = { file: null, baseDir: "/" };
    const server = (host: string, cluster: Record<string, unknown>, backend = "postgres") =>
      base({ server: { port: 7420, host, allow_insecure_http: true, state: { backend }, cluster } });
    const flags = { onClientListener: false, allowInsecureTransport: false };
    expect(buildServerConfig(server("127.0.0.1", { listen_port: 7421 }), opts).cluster).toEqual({
      advertiseUrl: null,
      listen: { host: "127.0.0.1", port: 7421 },
      ...flags,
    });
    // The clients' listener on every address, the instances' one on a private address: no advertise_url needed.
    expect(
      buildServerConfig(
        server("0.0.0.0", { listen_port: 7421, listen_host: "10.0.0.5", allow_insecure_transport: true }),
        opts,
      ).cluster,
    ).toEqual({ advertiseUrl: null, listen: { host: "10.0.0.5", port: 7421 }, ...flags, allowInsecureTransport: true });
    expect(() => buildServerConfig(server("10.0.0.5", { listen_port: 7421, listen_host: "::" }), opts)).toThrow(
      /server\.cluster\.advertise_url: required when the listener of server\.cluster is "::"/,
    );
    expect(() => buildServerConfig(server("127.0.0.1", { listen_port: 7421 }, "sqlite"), opts)).toThrow(
      /server\.cluster\.listen_port: only with \[server\.state\] backend = "postgres"/,
    );
    expect(() => buildServerConfig(server("127.0.0.1", { listen_port: 7420 }), opts)).toThrow(
      /server\.cluster\.listen_port: must differ from server\.port \(7420\)/,
    );
    for (const bad of [-1, 65_536, 1.5, "7421"]) {
      expect(() => buildServerConfig(server("127.0.0.1", { listen_port: bad }), opts)).toThrow(/listen_port/);
    }
  });

  it("reads a runner's shared_user_principals (absent: no restriction) and refuses a principal it does not know", () => {
    const principals = [{ id: "alice" }, { id: "bob" }];
    expect(buildServerConfig(base({ principals }), { file: null, baseDir: "/" }).runners[0]?.sharedUserPrincipals).toBe(
      null,
    );
    const listed = buildServerConfig(
      base({
        principals,
        runners: [{ id: "r1", token_sha256: HASH, projects: [], shared_user_principals: ["alice"] }],
      }),
      { file: null, baseDir: "/" },
    );
    expect([...(listed.runners[0]?.sharedUserPrincipals ?? [])]).toEqual(["alice"]);
    expect(() =>
      buildServerConfig(
        base({
          principals,
          runners: [{ id: "r1", token_sha256: HASH, projects: [], shared_user_principals: ["alice", "mallory"] }],
        }),
        { file: "/etc/wc/server.toml", baseDir: "/" },
      ),
    ).toThrow(
      '/etc/wc/server.toml: runners[0].shared_user_principals: "mallory" is not a configured principal ([[principals]] id)',
    );
  });

  it("declares 10,000 runners, each bound to its own project, and refuses one more than MAX_RUNNERS", () => {
    const runners = (n: number) =>
      Array.from({ length: n }, (_, i) => ({ id: `r${i}`, token_sha256: sha256Hex(`t${i}`), projects: [`p${i}`] }));
    const c = buildServerConfig(base({ runners: runners(10_000) }), { file: null, baseDir: "/" });
    expect(c.runners).toHaveLength(10_000);
    expect(c.projectRunner.get("p9999")).toBe("r9999");
    expect(() =>
      buildServerConfig(base({ runners: runners(MAX_RUNNERS + 1) }), { file: "f.toml", baseDir: "/" }),
    ).toThrow(/runners.*16384/);
  });

  it("hashes a token_env token at start", () => {
    const c = buildServerConfig(base({ runners: [{ id: "r1", token_env: "RUNNER_TOK", projects: [] }] }), {
      file: null,
      baseDir: "/",
      env: { RUNNER_TOK: "t" },
    });
    expect(c.runners[0]?.tokenHash.toString("hex")).toBe(HASH);
  });

  it.each([
    ["an unknown key", base({ extra: 1 }), "extra"],
    [
      "a project bound to two runners",
      base({
        runners: [
          { id: "a", token_sha256: HASH, projects: ["p"] },
          { id: "b", token_sha256: HASH, projects: ["p"] },
        ],
      }),
      "already bound",
    ],
    [
      "a duplicate runner id",
      base({
        runners: [
          { id: "a", token_sha256: HASH },
          { id: "a", token_sha256: HASH },
        ],
      }),
      "duplicate runner id",
    ],
    ["both token forms", base({ runners: [{ id: "a", token_sha256: HASH, token_env: "X" }] }), "exactly one"],
    ["a missing token_env variable", base({ runners: [{ id: "a", token_env: "NOPE_NOT_SET" }] }), "NOPE_NOT_SET"],
    ["a bad runner id", base({ runners: [{ id: "A B", token_sha256: HASH }] }), "runners.0.id"],
    ["an unknown scope", base({ principals: [{ id: "p", scopes: ["root"] }] }), "principals.0.scopes.0"],
  ])("rejects %s with a precise message", (_name, doc, needle) => {
    expect(() => buildServerConfig(doc, { file: "f.toml", baseDir: "/", env: {} })).toThrow(ConfigError);
    expect(() => buildServerConfig(doc, { file: "f.toml", baseDir: "/", env: {} })).toThrow(needle);
  });

  it("names the nearest known key of the table for an unknown one, and guesses nothing when none is near", () => {
    const typo = base({ server: { port: 0, state_dir: "s", heartbeat_intervl_ms: 2000 } });
    expect(() => buildServerConfig(typo, { file: "f.toml", baseDir: "/", env: {} })).toThrow(
      "(unknown key heartbeat_intervl_ms (did you mean `heartbeat_interval_ms`?))",
    );
    const inRunner = base({ runners: [{ id: "r1", token_sha256: HASH, project: ["demo"] }] });
    expect(() => buildServerConfig(inRunner, { file: "f.toml", baseDir: "/", env: {} })).toThrow(
      "(did you mean `projects`?)",
    );
    let far = "";
    try {
      buildServerConfig(base({ colour: "red" }), { file: "f.toml", baseDir: "/", env: {} });
    } catch (err) {
      far = (err as Error).message;
    }
    expect(far).toContain("(unknown key colour)");
    expect(far).not.toContain("did you mean");
  });

  it("reports invalid TOML as a ConfigError", () => {
    expect(() => parseServerConfig("[server\n", { file: "x.toml", baseDir: "/" })).toThrow(ConfigError);
  });

  it("loads the example config", async () => {
    const { loadServerConfig } = await import("../src/config.js");
    const c = loadServerConfig(join(REPO_ROOT, "packages/server/server.example.toml"));
    expect(c.projectRunner.get("demo")).toBe("local");
  });

  it("runner-token issue prints a token once and the matching config hash", () => {
    const out = execFileSync(process.execPath, [SERVER_BIN, "runner-token", "issue", "--runner", "r9"], {
      encoding: "utf8",
    });
    const token = /^(wcr_[A-Za-z0-9_-]{43})$/m.exec(out)?.[1];
    expect(token).toMatch(/^wcr_/);
    const hash = /token_sha256 = "([0-9a-f]{64})"/.exec(out)?.[1];
    expect(hash).toBe(
      createHash("sha256")
        .update(token ?? "")
        .digest("hex"),
    );
    expect(out).toContain('id = "r9"');
  });
});
