// `sluice router`: the OpenAI HTTP API (the same handlers as `sluice serve`) in
// front of remote prefill and decode workers; on the gRPC port, the public
// Inference API (sluice.v1.Inference) and the worker Registry they register
// with.
//
//   sluice router --model DIR [--host 127.0.0.1] [--port 8000] [--grpc-port
//   7000] ...
//
// The model folder provides the tokenizer, the chat template and config.json
// (max context); no weights are loaded. Extra HTTP endpoints: GET /v1/workers
// (the registry, JSON) and worker gauges appended to GET /metrics. /health
// answers 503 until at least one decode worker is registered.
#ifndef SLUICE_SERVICES_SERVE_ROUTER_COMMAND_H_
#define SLUICE_SERVICES_SERVE_ROUTER_COMMAND_H_

#include <cstdint>
#include <string>

#include "services/router/planner.h"
#include "services/serve/multimodal_setup.h"
#include "services/api/auth/api_auth.h"
#include "services/common/http_server.h"
#include "services/router/remote_backend.h"
#include "services/serve/render_flags.h"

namespace sluice {

struct RouterOptions {
  std::string model_dir;
  std::string served_model_name;  // empty: the model folder's name
  HttpServerOptions http;
  std::string grpc_host = "127.0.0.1";
  uint16_t grpc_port = 7000;  // Inference API + Registry; 0: any free port (printed)
  int32_t max_model_len = 0;  // 0: config.json max_position_embeddings
  int64_t max_concurrent_requests = 512;
  bool allow_unknown_fields = false;  // unknown request fields: warning instead of 400
  bool log_requests = true;           // one log line per generation request
  std::string tool_call_parser;       // hermes | llama3_json | deepseek_v3; "": the template's
  double lease_seconds = 6.0;    // workers heartbeat every lease/3
  // Each worker's lease: mean + k·stddev of its heartbeat gaps, within [lease, max_lease]
  // (services/router/heartbeat_lease.h); k = 0: the fixed lease_seconds.
  double lease_jitter_k = 4.0;
  double max_lease_seconds = 30.0;
  // A worker whose lease lapsed is suspect (no new work, its calls go on); removed after this.
  double suspect_grace_seconds = 60.0;
  // SIGTERM: refuse new requests (503, /health 503) and let those in flight finish within this.
  double drain_timeout_seconds = 30.0;
  std::string routing_policy = "kv";  // kv | load | round_robin (services/router/kv_router.h)
  RemoteBackendOptions backend;  // max_model_len is filled in from the above
  ApiAuthOptions auth;           // API keys on the HTTP and gRPC Inference APIs (none: open)
  PlannerOptions planner;        // SLOs and window of GET /v1/planner (services/router/planner.h)
  // Vision-language models: image limits and the template's content format (no cache: the
  // encoder workers cache embeddings).
  MultimodalFlags multimodal;
  // --tls-ca: mTLS with the workers (services/common/peer_tls.h), the router's identity being
  // http.tls_cert_file / tls_key_file. Empty: plaintext between services.
  std::string tls_ca_file;
  RenderFlags render;  // chat template render pools and budget
};

// RunRouter serves until SIGINT/SIGTERM. Prints "Sluice router listening on
// http://H:P grpc H:G" on stdout when ready. Returns the process exit code.
int RunRouter(const RouterOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_ROUTER_COMMAND_H_
