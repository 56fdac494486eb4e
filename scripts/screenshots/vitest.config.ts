import { defineConfig } from "vitest/config";

/**
 * `npm run screenshots`: regenerates the console and run view screenshots in docs/ (*.shots.ts) against a real
 * Server, Runner and fake agent in headless Chromium. Not part of `npm test`: it writes into the repository.
 */
export default defineConfig({
  test: {
    include: ["scripts/screenshots/**/*.shots.ts"],
    pool: "forks",
    testTimeout: 120_000,
    hookTimeout: 120_000,
  },
});
