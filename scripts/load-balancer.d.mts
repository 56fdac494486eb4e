/** One server behind the load balancer. */
export interface Backend {
  readonly host: string;
  readonly port: number;
}

export interface LoadBalancer {
  /** `http://127.0.0.1:PORT`, no trailing slash. */
  readonly url: string;
  readonly port: number;
  /** What a request or upgrade that reaches a dead backend gets: a 502 at once, or the next backend. */
  readonly deadBackend: "fails-fast";
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

export interface NginxLoadBalancer {
  readonly url: string;
  readonly port: number;
  /** nginx passes a request whose backend refused the connection on to the next one. */
  readonly deadBackend: "skipped";
  /** Rewrite the config and reload nginx; rejects (the old config keeps running) when nginx refuses it. */
  setBackends(backends: readonly Backend[]): Promise<void>;
  /** SIGTERM (SIGKILL after NGINX_STOP_TIMEOUT_MS) and remove its temp dir. Idempotent. */
  stop(): Promise<void>;
}

/** Bound on nginx stopping after SIGTERM before its process group is killed. */
export const NGINX_STOP_TIMEOUT_MS: number;
/** The nginx executable on PATH, or undefined when there is none. */
export function nginxPath(): string | undefined;
/** Debian's nginx as the same round-robin balancer; rejects, saying so, when nginx is not on PATH. */
export function startNginxLoadBalancer(backends: readonly Backend[]): Promise<NginxLoadBalancer>;
