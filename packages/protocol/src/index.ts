export * from "./bounds.js";
export * from "./events.js";
export * from "./frames.js";
export * from "./hosts.js";
export * from "./ids.js";
export * from "./parse.js";
export * from "./terminal-safe.js";
export * from "./vocab.js";
