/**
 * The CLI's one local error type, and the one function that turns anything
 * thrown into it. Each error says what failed and what to check, and carries
 * the exit code the command ends with.
 */
import { ProtocolError, SdkError, SdkErrorCode, SdkHttpError } from "@modelcontextprotocol/client";
import { EXIT } from "./exit-codes.js";

export type CliErrorCode =
  /** The command line is wrong (exit 2). */
  | "usage"
  /** The Server could not be reached. */
  | "connection"
  /** The Server refused the token. */
  | "auth"
  /** The Server answered, but not in a way this CLI understands. */
  | "protocol"
  /** A tool answered with an error result (`code` from the Server is kept in `toolCode`). */
  | "tool"
  /** Following was interrupted by the user. */
  | "interrupted";

export class CliError extends Error {
  readonly code: CliErrorCode;
  readonly hint: string | undefined;
  readonly toolCode: string | undefined;
  readonly recoveryKind: string | undefined;
  readonly exitCode: number;

  constructor(
    code: CliErrorCode,
    message: string,
    options: {
      hint?: string | undefined;
      toolCode?: string | undefined;
      recoveryKind?: string | undefined;
      cause?: unknown;
    } = {},
  ) {
    super(message, options.cause !== undefined ? { cause: options.cause } : undefined);
    this.name = "CliError";
    this.code = code;
    this.hint = options.hint;
    this.toolCode = options.toolCode;
    this.recoveryKind = options.recoveryKind;
    this.exitCode = code === "usage" ? EXIT.usage : code === "interrupted" ? EXIT.cancelled : EXIT.failed;
  }

  /** True when retrying the same call later may succeed (the Server restarted, a network blip). */
  get transient(): boolean {
    return this.code === "connection";
  }
}

const NETWORK_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ENOTFOUND",
  "EAI_AGAIN",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "EPIPE",
  "UND_ERR_SOCKET",
]);

function causeCode(err: unknown): string | undefined {
  let current: unknown = err;
  for (let depth = 0; depth < 5 && current instanceof Error; depth++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string") return code;
    // undici reports a refused dual-stack connect as an AggregateError of attempts.
    current = current instanceof AggregateError && current.cause === undefined ? current.errors[0] : current.cause;
  }
  return undefined;
}

/** The scope list in the Server's HTTP 403 `insufficient_scope (this call needs: A B)` answer. */
const INSUFFICIENT_SCOPE = /insufficient_scope \(this call needs: ((?:[a-z_]{1,32}:[a-z_]{1,32} ?){1,8})\)/;

/** A CliError for an HTTP error status the Server at `url` answered (`message`: its JSON-RPC error text). */
export function httpStatusError(status: number, message: string, url: string, cause?: unknown): CliError {
  const withCause = cause !== undefined ? { cause } : {};
  if (status === 401) {
    return new CliError("auth", `the Server at ${url} rejected the token (HTTP 401)`, {
      hint: "Check WEBCODEX_TOKEN / --token: it must be a principal token issued by `webcodex-server token issue` for this Server.",
      ...withCause,
    });
  }
  if (status === 403) {
    // The Server's insufficient_scope answer (an OAuth token) names what the call needs.
    const needs = INSUFFICIENT_SCOPE.exec(message)?.[1];
    return new CliError("auth", `the Server at ${url} refused this token (HTTP 403)`, {
      hint:
        needs !== undefined
          ? `This token was not granted what the call needs: ${needs}. Connect again and grant it, or use a token issued with it.`
          : "The token is valid but the Server refused the request: a scope the call needs, or this request's Origin, is not allowed.",
      ...withCause,
    });
  }
  if (status === 404) {
    return new CliError("connection", `no MCP endpoint at ${url} (HTTP 404)`, {
      hint: "Check WEBCODEX_URL / --url: it is the Server's MCP URL and usually ends in /mcp.",
      ...withCause,
    });
  }
  return new CliError("connection", `the Server at ${url} answered HTTP ${status}`, {
    hint: "Check that WEBCODEX_URL points at a running webcodex-server and look at its log.",
    ...withCause,
  });
}

/** The HTTP status an SDK error carries (its `data.status`), if any. */
function sdkHttpStatus(err: SdkError): number | undefined {
  const status = (err.data as { status?: unknown } | undefined)?.status;
  return typeof status === "number" ? status : undefined;
}

/** Maps anything thrown while talking to the Server at `url` to a CliError. */
export function toCliError(err: unknown, url: string): CliError {
  if (err instanceof CliError) return err;
  // 403 insufficient_scope: the SDK client raises its own error naming the scope the Server asked for.
  if (err instanceof Error && err.name === "InsufficientScopeError") {
    const scopes = /required "([^"]*)"/.exec(err.message)?.[1];
    return httpStatusError(
      403,
      scopes !== undefined ? `insufficient_scope (this call needs: ${scopes})` : "",
      url,
      err,
    );
  }
  if (err instanceof SdkHttpError || (err instanceof SdkError && sdkHttpStatus(err) !== undefined)) {
    const status = sdkHttpStatus(err as SdkError);
    if (status !== undefined) return httpStatusError(status, err.message, url, err);
  }
  if (err instanceof SdkError && err.code === SdkErrorCode.EraNegotiationFailed) {
    // The pinned 2026-07-28 probe (server/discover) got no usable answer.
    if (/fetch failed|probe failed/i.test(err.message) && !/did not offer/.test(err.message)) {
      return new CliError("connection", `cannot reach the Server at ${url}`, {
        hint: "Check that webcodex-server is running and that WEBCODEX_URL / --url is right (e.g. http://127.0.0.1:7420/mcp).",
        cause: err,
      });
    }
    return new CliError("connection", `no MCP 2026-07-28 endpoint at ${url} (server/discover was not answered)`, {
      hint: "Check WEBCODEX_URL / --url: it is the Server's MCP URL and usually ends in /mcp, on a webcodex-server of this version.",
      cause: err,
    });
  }
  if (err instanceof ProtocolError) {
    return new CliError("protocol", `the Server at ${url} returned an MCP error (${err.code}): ${err.message}`, {
      hint: "Is this a webcodex-server? `webcodex` needs the start/observe/cancel_coding_agent tools.",
      cause: err,
    });
  }
  const code = causeCode(err);
  if (code !== undefined && NETWORK_CODES.has(code)) {
    return new CliError("connection", `cannot reach the Server at ${url} (${code})`, {
      hint: "Check that webcodex-server is running and that WEBCODEX_URL / --url is right (e.g. http://127.0.0.1:7420/mcp).",
      cause: err,
    });
  }
  if (err instanceof TypeError && /fetch failed/i.test(err.message)) {
    return new CliError("connection", `cannot reach the Server at ${url}`, {
      hint: "Check that webcodex-server is running and that WEBCODEX_URL / --url is right.",
      cause: err,
    });
  }
  if (err instanceof Error && err.name === "AbortError") {
    return new CliError("interrupted", "interrupted", { cause: err });
  }
  const message = err instanceof Error ? err.message : String(err);
  return new CliError("protocol", `talking to the Server at ${url} failed: ${message}`, { cause: err });
}
