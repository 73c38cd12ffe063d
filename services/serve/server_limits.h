// Input limits of the public listeners (`sluice serve`, `sluice router`): HTTP sizes and slow
// client timeouts as flags, and the process's open-file limit raised so that many idle or
// trickling connections cannot exhaust it.
#ifndef SLUICE_SERVICES_SERVE_SERVER_LIMITS_H_
#define SLUICE_SERVICES_SERVE_SERVER_LIMITS_H_

#include <cstdint>

#include <CLI/CLI.hpp>

#include "services/common/http_server.h"

namespace sluice {

// AddHttpLimitFlags registers --max-request-body-bytes, --max-request-header-bytes,
// --http-request-timeout-s and --http-idle-timeout-s.
void AddHttpLimitFlags(CLI::App& app, HttpServerOptions& http);

// RaiseOpenFileLimit lifts RLIMIT_NOFILE's soft limit to its hard limit and returns the new
// soft limit (the old one when it cannot be raised).
uint64_t RaiseOpenFileLimit();

// kMaxGrpcMessageBytes bounds a gRPC message received on the public Inference API: like the
// HTTP body limit, it bounds the prompt a client can send in one call.
inline constexpr int kMaxGrpcMessageBytes = 8 << 20;

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_SERVER_LIMITS_H_
