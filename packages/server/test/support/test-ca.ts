/**
 * A private CA and a server certificate for 127.0.0.1/localhost, made in a temp dir with the
 * `openssl` CLI (P-256 keys, valid one day). For the TLS tests: the Server serves `cert`/`key`,
 * the Runner trusts `caFile`.
 */
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

export interface TestCa {
  caFile: string;
  certFile: string;
  keyFile: string;
}

export function makeTestCa(dir: string): TestCa {
  const ssl = (...args: string[]) => execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "pipe", "pipe"] });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  ssl("req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=webcodex test CA");
  ssl("req", ...ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1");
  writeFileSync(join(dir, "server.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  ssl(
    "x509",
    "-req",
    "-in",
    "server.csr",
    "-CA",
    "ca.crt",
    "-CAkey",
    "ca.key",
    "-CAcreateserial",
    "-out",
    "server.crt",
    "-days",
    "1",
    "-extfile",
    "server.ext",
  );
  return { caFile: join(dir, "ca.crt"), certFile: join(dir, "server.crt"), keyFile: join(dir, "server.key") };
}
