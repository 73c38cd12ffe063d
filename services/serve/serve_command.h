// `sluice serve`: the OpenAI-compatible HTTP server over an in-process engine.
#ifndef SLUICE_SERVICES_SERVE_SERVE_COMMAND_H_
#define SLUICE_SERVICES_SERVE_SERVE_COMMAND_H_

#include <cstdint>
#include <string>

#include "services/api/http_server.h"
#include "services/serve/model_runtime.h"

namespace sluice {

struct ServeOptions {
  RuntimeOptions runtime;
  HttpServerOptions http;
  int64_t max_concurrent_requests = 512;  // generation requests in flight before 503
};

// RunServe loads the model, listens, prints "Sluice listening on http://HOST:PORT" on stdout
// once accepting, and serves until SIGINT/SIGTERM. Returns the process exit code.
int RunServe(const ServeOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_SERVE_COMMAND_H_
