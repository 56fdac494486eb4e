/**
 * The host side of an MCP App (ext-apps `AppBridge`) for the run view's browser tests and screenshots, bundled
 * by app-host.ts and served on loopback. `mountRunView` renders the view's HTML in a sandboxed iframe (scripts
 * only: an opaque origin, no access to this page), answers `ui/initialize` with this host's context (theme),
 * hands it the tool input and result as a chat host does after a tool call, and forwards the view's
 * `tools/call` to `window.hostCallTool` — a function the test exposes, which calls the real Server with the
 * test's own credentials. The view never sees a credential.
 */
import { AppBridge, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";

window.mountRunView = async ({ html, toolInput, toolResult, theme, height }) => {
  const iframe = document.createElement("iframe");
  iframe.setAttribute("sandbox", "allow-scripts");
  iframe.title = "Coding agent run";
  iframe.style.height = `${height}px`;
  document.getElementById("host").append(iframe);
  const bridge = new AppBridge(
    null,
    { name: "webcodex-test-host", version: "0.0.0" },
    { serverTools: {} },
    { hostContext: { theme, displayMode: "inline", platform: "web" } },
  );
  bridge.oncalltool = (params) => window.hostCallTool(params);
  bridge.onsizechange = (size) => {
    if (typeof size.height === "number") iframe.style.height = `${Math.max(height, size.height)}px`;
  };
  const initialized = new Promise((resolve) => {
    bridge.oninitialized = () => resolve();
  });
  await bridge.connect(new PostMessageTransport(iframe.contentWindow, iframe.contentWindow));
  iframe.srcdoc = html;
  await initialized;
  await bridge.sendToolInput({ arguments: toolInput });
  await bridge.sendToolResult(toolResult);
};
