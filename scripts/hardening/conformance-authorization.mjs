/**
 * The conformance suite's `authorization` mode against the Server's own
 * authorization server, unattended: `authorization-server-metadata-endpoint`
 * and `authorization-code-grant` (PKCE, `resource`, `iss`, the token response).
 *
 * The suite prints an authorization URL and waits for the browser to come back
 * to its loopback callback (`http://127.0.0.1:<port>/callback`). Here a
 * `webcodex-server run` child with `[oauth] enabled` has that callback
 * registered as an operator client (`[[oauth.clients]]`); the script reads the
 * URL from the suite's stdout and a headless Chromium (scripts/browser.mjs)
 * does what a person does on the consent page: types the access key, Continue,
 * Allow, and follows the result page back to the suite's callback. The suite
 * then exchanges the code itself.
 */
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { browserLaunchOptions } from "../browser.mjs";
import { sha256Hex, startServer, stopInOrder, toml } from "../local-stack.mjs";

/** The operator client the suite authorizes as (its callback is the only redirect URI). */
export const SUITE_CLIENT_ID = "mcp-conformance-suite";
/** The two scenarios the suite's authorization mode runs, in order (the grant uses the metadata's endpoints). */
export const AUTHORIZATION_SCENARIOS = ["authorization-server-metadata-endpoint", "authorization-code-grant"];
/** Bound on each browser step (page load, click, the redirect back to the suite). */
const CONSENT_STEP_TIMEOUT_MS = 30_000;
/** Bound on the suite printing the authorization URL after it starts. */
const AUTH_URL_TIMEOUT_MS = 60_000;

/** A port that is free right now on 127.0.0.1 (the Server's public_url and the suite's callback name theirs). */
function freePort() {
  return new Promise((resolvePort, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address();
      probe.close(() => resolvePort(port));
    });
  });
}

/**
 * Answers the consent page at `authorizationUrl` in headless Chromium with `key` (Continue, then Allow) and
 * follows the result page's Continue to the client's redirect URI, which must start with `callbackPrefix`.
 */
export async function approveInBrowser(authorizationUrl, key, callbackPrefix) {
  const { chromium } = await import("playwright-core");
  const browser = await chromium.launch(await browserLaunchOptions());
  try {
    const page = await browser.newPage();
    page.setDefaultTimeout(CONSENT_STEP_TIMEOUT_MS);
    const opened = await page.goto(authorizationUrl);
    if (opened?.status() !== 200)
      throw new Error(
        `the consent page answered HTTP ${opened?.status()}: ${await page.locator("main").textContent()}`,
      );
    await page.fill("#key", key);
    await page.click('button[value="review"]');
    await page.click('button[value="approve"]');
    await page.click("#continue");
    await page.waitForURL((u) => u.href.startsWith(callbackPrefix));
  } finally {
    await browser.close();
  }
}

/**
 * Runs the suite's authorization mode against a fresh OAuth-enabled Server in `dir`; resolves with the suite's
 * exit code and output. `installed` is conformance-install.mjs's {node, cli}.
 */
export async function runAuthorizationPass({ installed, dir, outputDir, timeoutMs }) {
  const key = `wct_${randomBytes(24).toString("base64url")}`;
  const scopes = ["project:read", "project:write"];
  const serverPort = await freePort();
  const callbackPort = await freePort();
  const origin = `http://127.0.0.1:${serverPort}`;
  const callback = `http://127.0.0.1:${callbackPort}/callback`;
  const configFile = join(dir, "server-oauth.toml");
  writeFileSync(
    configFile,
    `[server]\nhost = "127.0.0.1"\nport = ${serverPort}\nstate_dir = "state-oauth"\npublic_url = ${toml(origin)}\n\n` +
      `[oauth]\nenabled = true\n\n` +
      `[[oauth.clients]]\nclient_id = ${toml(SUITE_CLIENT_ID)}\nname = "MCP conformance suite"\n` +
      `redirect_uris = [${toml(callback)}]\n\n` +
      `[[principals]]\nid = "conformance-person"\nscopes = ${JSON.stringify(scopes)}\nprojects = ["demo"]\n` +
      `token_sha256 = [${toml(sha256Hex(key))}]\ntoken_scopes = ${JSON.stringify(scopes)}\n`,
  );
  const serverLines = [];
  const { child: server } = await startServer({
    configFile,
    cwd: dir,
    env: { ...process.env, WEBCODEX_LOG_LEVEL: "warn" },
    onLine: (line) => serverLines.push(line),
  });
  let output = "";
  try {
    const args = [
      installed.cli,
      "authorization",
      "--url",
      origin,
      "--client-id",
      SUITE_CLIENT_ID,
      "--resource",
      `${origin}/mcp`,
      "--port",
      String(callbackPort),
      "--output-dir",
      outputDir,
    ];
    const suite = spawn(installed.node, args, { cwd: dir, stdio: ["ignore", "pipe", "pipe"] });
    suite.stderr.on("data", (c) => (output += c.toString("utf8")));
    let urlTimer;
    const urlSeen = new Promise((resolveUrl, rejectUrl) => {
      urlTimer = setTimeout(
        () => rejectUrl(new Error(`the suite printed no authorization URL within ${AUTH_URL_TIMEOUT_MS / 1000} s`)),
        AUTH_URL_TIMEOUT_MS,
      );
      createInterface({ input: suite.stdout }).on("line", (line) => {
        output += `${line}\n`;
        const registered = /^Ensure (\S+) is registered as a redirect URI for client '([^']*)'/.exec(line);
        if (registered && (registered[1] !== callback || registered[2] !== SUITE_CLIENT_ID))
          rejectUrl(new Error(`the suite expects ${registered[1]} for ${registered[2]}, configured ${callback}`));
        if (line.startsWith(`${origin}/authorize?`)) resolveUrl(line.trim());
      });
    });
    urlSeen.catch(() => {});
    const exited = new Promise((resolveExit, rejectExit) => {
      const timer = setTimeout(() => {
        suite.kill("SIGKILL");
        rejectExit(new Error(`the authorization pass did not finish within ${timeoutMs / 1000} s`));
      }, timeoutMs);
      suite.once("error", rejectExit);
      suite.once("exit", (c) => {
        clearTimeout(timer);
        clearTimeout(urlTimer);
        resolveExit(c ?? 1);
      });
    });
    const consent = Promise.race([urlSeen, exited.then(() => null)]).then((url) =>
      url === null ? undefined : approveInBrowser(url, key, callback),
    );
    const [code] = await Promise.all([
      exited,
      consent.catch((err) => {
        output += `\nconsent in the browser failed: ${err.message}\n`;
        suite.kill("SIGKILL");
      }),
    ]);
    return { code, output, serverLines };
  } finally {
    await stopInOrder([server]);
  }
}
