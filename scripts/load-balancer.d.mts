/** One server behind the load balancer. */
export interface Backend {
  readonly host: string;
  readonly port: number;
}

export interface LoadBalancer {
  /** `http://127.0.0.1:PORT`, no trailing slash. */
  readonly url: string;
  readonly port: number;
  /** Replace the backend list (at least one); the round robin restarts at the first. */
  setBackends(backends: readonly Backend[]): void;
  /** How many requests plus upgrades each backend (`host:port`) was sent, in the list's order. */
  counts(): Record<string, number>;
  /** Close the listener and every connection through it. Idempotent. */
  stop(): Promise<void>;
}

/** Bound on binding the listener. */
export const LOAD_BALANCER_START_TIMEOUT_MS: number;
/** How long a backend that refused a connection is skipped (unless every backend is marked dead). */
export const DEAD_BACKEND_COOLDOWN_MS: number;
/** Idle bound on a proxied request's backend socket. */
export const BACKEND_IDLE_TIMEOUT_MS: number;
/** The response header naming the backend (`host:port`) that answered. */
export const BACKEND_HEADER: string;

/** A round-robin load balancer on a free 127.0.0.1 port in front of `backends` (scripts/load-balancer.mjs). */
export function startLoadBalancer(backends: readonly Backend[]): Promise<LoadBalancer>;
