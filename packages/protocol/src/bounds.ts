/**
 * Every bound shared by the Server and the Runner, as one named constant each.
 * Changing one of these is a protocol change: bump PROTOCOL_VERSION.
 */

/**
 * Version of the Server<->Runner WebSocket protocol spoken by this build. 3: `run.changes`, `run.apply`, and
 * `run.start`'s workspace and continuation fields (a Runner of 2 would refuse those frames mid-link).
 */
export const PROTOCOL_VERSION = 3;

/** Largest WebSocket text frame either side accepts, in UTF-8 bytes. */
export const MAX_FRAME_BYTES = 1024 * 1024;
/** Deepest JSON nesting a frame may have before it is rejected unparsed. */
export const MAX_FRAME_DEPTH = 16;

/** Largest prompt accepted by start_coding_agent and run.start, in UTF-8 bytes. */
export const MAX_PROMPT_BYTES = 64 * 1024;
/** Text bodies of events (messages, reasoning, plan entries) are cut to this many UTF-8 bytes. */
export const MAX_EVENT_TEXT_BYTES = 4 * 1024;
/** Short labels in events (titles, option names) are cut to this many UTF-8 bytes. */
export const MAX_EVENT_LABEL_BYTES = 256;
/** Plan events carry at most this many entries. */
export const MAX_PLAN_ENTRIES = 50;
/** Permission request events list at most this many options. */
export const MAX_PERMISSION_OPTIONS = 16;
/** agent_state events list at most this many config options or command names. */
export const MAX_AGENT_STATE_ITEMS = 64;

/** Caller/forced config: at most this many keys per run. */
export const MAX_CONFIG_ENTRIES = 32;
/** Config option values (strings) are at most this long. */
export const MAX_CONFIG_VALUE_LENGTH = 256;

/** Terminal/failure messages are fixed texts; this caps them on the wire. */
export const MAX_MESSAGE_LENGTH = 512;

/** A run's usage: token counts above this are dropped (null); far above any real context window. */
export const MAX_USAGE_TOKENS = 1_000_000_000_000;
/** A run's usage: cost amounts above this are dropped (null); no one turn costs a billion. */
export const MAX_USAGE_COST_AMOUNT = 1_000_000_000;

/** Events per run.update frame pushed by the Runner. */
export const MAX_EVENTS_PER_UPDATE = 256;
/**
 * Serialized bytes of the events in one run.update or run.sync.result frame:
 * half a frame, which leaves the rest for the run summary and the envelope.
 */
export const UPDATE_EVENT_BYTES = Math.floor(MAX_FRAME_BYTES / 2);
/** Events per run.sync result. */
export const MAX_EVENTS_PER_SYNC = 1000;
/** Events per observe_coding_agent result. */
export const MAX_EVENTS_PER_OBSERVE = 200;
/** Serialized budget of one observe_coding_agent result (structuredContent JSON), in bytes. */
export const OBSERVE_OUTPUT_BUDGET_BYTES = 96 * 1024;
/** Longest single wait of observe_coding_agent. */
export const MAX_OBSERVE_WAIT_SECS = 30;

/** Run summaries in a hello. */
export const MAX_INVENTORY_RUNS = 1000;
/** Providers a Runner may advertise. */
export const MAX_PROVIDERS = 64;
/** Projects a Runner may advertise. */
export const MAX_PROJECTS = 256;
/** allowed_config_options per provider. */
export const MAX_ALLOWED_CONFIG_OPTIONS = 64;
/** Effective-config snapshot entries recorded on a run. */
export const MAX_EFFECTIVE_CONFIG_ENTRIES = 64;

/** Per-run event ring on the Runner and mirror on the Server: event count. */
export const RING_MAX_EVENTS = 10_000;
/** Per-run event ring on the Runner and mirror on the Server: serialized bytes. */
export const RING_MAX_BYTES = 8 * 1024 * 1024;

/** Run timeouts accepted on the wire (the Runner clamps to its own max). */
export const MIN_RUN_TIMEOUT_SECS = 1;
export const MAX_RUN_TIMEOUT_SECS = 24 * 60 * 60;
