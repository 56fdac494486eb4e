/**
 * The real round-robin load balancer the cluster tests put in front of several Server processes:
 * scripts/load-balancer.mjs (plain JavaScript, so examples/cluster runs it with `node` alone). Its contract —
 * one turn per request and per WebSocket upgrade, unbuffered streaming, a dead backend failing fast and then
 * skipped — is in that file and tested by scripts/test/load-balancer.test.ts.
 */
export {
  BACKEND_HEADER,
  BACKEND_IDLE_TIMEOUT_MS,
  type Backend,
  DEAD_BACKEND_COOLDOWN_MS,
  LOAD_BALANCER_START_TIMEOUT_MS,
  type LoadBalancer,
  NGINX_STOP_TIMEOUT_MS,
  type NginxLoadBalancer,
  nginxPath,
  startLoadBalancer,
  startNginxLoadBalancer,
} from "../load-balancer.mjs";
