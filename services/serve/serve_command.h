// `sluice serve`: the OpenAI-compatible HTTP server over an in-process engine.
#ifndef SLUICE_SERVICES_SERVE_SERVE_COMMAND_H_
#define SLUICE_SERVICES_SERVE_SERVE_COMMAND_H_

#include <cstdint>
#include <string>

#include "services/api/auth/api_auth.h"
#include "services/common/http_server.h"
#include "services/serve/model_runtime.h"
#include "services/serve/multimodal_setup.h"
#include "services/serve/render_flags.h"

namespace sluice {

struct ServeOptions {
  RuntimeOptions runtime;
  HttpServerOptions http;
  int64_t max_concurrent_requests = 512;  // generation requests in flight before 503
  bool allow_unknown_fields = false;      // unknown request fields: warning instead of 400
  bool log_requests = true;               // one log line per generation request
  std::string tool_call_parser;           // hermes | llama3_json | deepseek_v3; "": the template's
  // The gRPC API (sluice.v1.Inference) on grpc_host:grpc_port; -1: off, 0: any free port.
  std::string grpc_host = "127.0.0.1";
  int32_t grpc_port = -1;
  ApiAuthOptions auth;  // API keys (none: open)
  MultimodalFlags multimodal;  // vision-language models
  RenderFlags render;          // chat template render pools and budget
  // --tls-ca: mTLS with the --kvstore shards, http's certificate being this server's identity
  // (empty: the kvstore is reached in plaintext).
  std::string tls_ca_file;
};

// RunServe loads the model, listens, prints "Sluice listening on http://HOST:PORT" on stdout
// (followed by " grpc HOST:PORT" when the gRPC API is on) once accepting, and serves until
// SIGINT/SIGTERM (SIGHUP reloads the API keys file). Returns the process exit code.
int RunServe(const ServeOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_SERVE_COMMAND_H_
