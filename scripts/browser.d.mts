import type { LaunchOptions } from "playwright-core";

/** Options for `chromium.launch()` from playwright-core: the packaged browser, headless, its flags. */
export function browserLaunchOptions(): Promise<LaunchOptions>;
