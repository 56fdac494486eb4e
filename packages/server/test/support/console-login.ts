/**
 * Signing in to the operator console as a browser would: the login form's CSRF cookie and field, then the
 * session cookie and the page's CSRF token.
 */

/** POST /console/login as a browser would (login form CSRF cookie + field); returns the session cookie. */
export async function consoleLogin(
  origin: string,
  key: string,
  client?: string,
): Promise<{ status: number; cookie: string | null; csrf: string | null }> {
  const forwarded: Record<string, string> = client === undefined ? {} : { "x-forwarded-for": client };
  const form = await fetch(`${origin}/console/login`, { headers: forwarded });
  const token = /name="login_csrf" value="([^"]*)"/.exec(await form.text())?.[1] ?? "";
  const res = await fetch(`${origin}/console/login`, {
    method: "POST",
    redirect: "manual",
    headers: {
      "content-type": "application/x-www-form-urlencoded",
      cookie: (form.headers.get("set-cookie") ?? "").split(";")[0] ?? "",
      origin,
      ...forwarded,
    },
    body: new URLSearchParams({ login_csrf: token, key }),
  });
  const session = res.headers
    .getSetCookie()
    .find((c) => c.startsWith("wc_console="))
    ?.split(";")[0];
  if (!session) return { status: res.status, cookie: null, csrf: null };
  const page = await (await fetch(`${origin}/console`, { headers: { cookie: session } })).text();
  return {
    status: res.status,
    cookie: session,
    csrf: /name="webcodex-csrf" content="([^"]*)"/.exec(page)?.[1] ?? null,
  };
}
