// --tls-cert / --tls-key for the public listeners of `sluice serve` and `sluice router`: HTTPS on
// the HTTP port and TLS on the gRPC port, both re-reading the files when they change.
#ifndef SLUICE_SERVICES_SERVE_TLS_FLAGS_H_
#define SLUICE_SERVICES_SERVE_TLS_FLAGS_H_

#include <grpcpp/security/server_credentials.h>

#include <memory>

#include <CLI/CLI.hpp>

#include "services/api/http_server.h"

namespace sluice {

// AddTlsFlags registers --tls-cert and --tls-key (both or neither) into `http`.
void AddTlsFlags(CLI::App& app, HttpServerOptions& http);

// GrpcServerCredentials returns TLS credentials from http's certificate and key (watched for
// changes every few seconds by gRPC's file watcher), or insecure ones when TLS is off.
std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials(const HttpServerOptions& http);

// Scheme is "https" or "http".
inline const char* Scheme(const HttpServerOptions& http) {
  return http.tls_cert_file.empty() ? "http" : "https";
}

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_TLS_FLAGS_H_
