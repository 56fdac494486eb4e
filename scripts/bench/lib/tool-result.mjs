/** An MCP tool result → `{ ok, value | error }`: structuredContent, else the JSON in the first text block. */
export function unwrap(result) {
  const body = result?.structuredContent ?? parseText(result);
  if (result?.isError) return { ok: false, error: body?.error ?? body };
  return { ok: true, value: body };
}

function parseText(result) {
  const text = result?.content?.find((c) => c.type === "text")?.text;
  if (!text) return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return { error: { code: "unparsed", message: text.slice(0, 200) } };
  }
}
