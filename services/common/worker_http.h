// Worker HTTP endpoint: GET /metrics (Prometheus text) and GET /health on a prefill or decode
// worker (`--http-port`), served by the same Boost.Beast HttpServer as the OpenAI API
// (services/common/http_server.h). Kubernetes probes and scrapers use it; the gRPC port stays for
// the router and peers.
#ifndef SLUICE_SERVICES_COMMON_WORKER_HTTP_H_
#define SLUICE_SERVICES_COMMON_WORKER_HTTP_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/common/http_server.h"

namespace sluice {

struct WorkerHttpOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: an ephemeral port (HttpServer::port)
  // Render returns the /metrics body; called on an io thread per scrape (must be thread-safe).
  std::function<std::string()> render_metrics;
  // Healthy: /health answers 200 {"status":"ok"} when true, 503 {"status":"draining"} when
  // false (readiness: a draining worker takes no new work). Thread-safe.
  std::function<bool()> healthy;
};

// StartWorkerHttp serves GET|HEAD /metrics and /health; other paths get 404, other methods on
// them 405. Errors as HttpServer::Start.
absl::StatusOr<std::unique_ptr<HttpServer>> StartWorkerHttp(WorkerHttpOptions options);

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_WORKER_HTTP_H_
