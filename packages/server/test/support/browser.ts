/**
 * The headless browser every browser test launches: scripts/browser.mjs (the
 * Chromium that the `@sparticuz/chromium` devDependency ships, driven by
 * playwright-core, inflated once per package version), shared with the Node
 * scripts.
 */
export { browserLaunchOptions } from "../../../../scripts/browser.mjs";
