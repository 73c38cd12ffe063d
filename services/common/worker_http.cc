#include "services/common/worker_http.h"

#include <utility>

namespace sluice {

absl::StatusOr<std::unique_ptr<HttpServer>> StartWorkerHttp(WorkerHttpOptions options) {
  HttpServerOptions http;
  http.host = options.host;
  http.port = options.port;
  http.num_io_threads = 1;  // scrapes and probes only
  http.body_limit_bytes = 64 << 10;
  auto render = std::move(options.render_metrics);
  auto healthy = std::move(options.healthy);
  HttpHandler handler = [render, healthy](const HttpRequestInfo& request,
                                          std::shared_ptr<ResponseSink> sink,
                                          Poster) -> std::shared_ptr<RequestHandle> {
    const std::string path = request.target.substr(0, request.target.find('?'));
    const bool known = path == "/metrics" || path == "/health";
    if (!known) {
      sink->SendResponse(404, "application/json", R"({"error":"not found"})");
    } else if (request.method != "GET" && request.method != "HEAD") {
      sink->SendResponse(405, "application/json", R"({"error":"method not allowed"})");
    } else if (path == "/metrics") {
      sink->SendResponse(200, "text/plain; version=0.0.4; charset=utf-8", render());
    } else if (healthy()) {
      sink->SendResponse(200, "application/json", R"({"status":"ok"})");
    } else {
      sink->SendResponse(503, "application/json", R"({"status":"draining"})");
    }
    return nullptr;
  };
  return HttpServer::Start(http, std::move(handler));
}

}  // namespace sluice
