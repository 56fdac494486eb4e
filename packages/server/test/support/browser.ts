/**
 * The headless browser every browser test launches (scripts/browser.mjs: the
 * Chromium that the `@sparticuz/chromium` devDependency ships, driven by
 * playwright-core, inflated once per package version), typed for the tests.
 */
import type { LaunchOptions } from "playwright-core";
import { browserLaunchOptions as launchOptions } from "../../../../scripts/browser.mjs";

/** Options for `chromium.launch()` from playwright-core: the packaged browser, headless, its flags. */
export async function browserLaunchOptions(): Promise<LaunchOptions> {
  return (await launchOptions()) as LaunchOptions;
}
