// --tls-cert / --tls-key for the public listeners of `sluice serve` and `sluice router`: HTTPS on
// the HTTP port and TLS on the gRPC port, both re-reading the files when they change.
#ifndef SLUICE_SERVICES_SERVE_TLS_FLAGS_H_
#define SLUICE_SERVICES_SERVE_TLS_FLAGS_H_

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "services/common/http_server.h"
#include "services/common/peer_tls.h"

namespace sluice {

// AddTlsFlags registers --tls-cert and --tls-key (both or neither) into `http`.
void AddTlsFlags(CLI::App& app, HttpServerOptions& http);

// GrpcServerCredentials returns TLS credentials from http's certificate and key (watched for
// changes every few seconds by gRPC's file watcher), or insecure ones when TLS is off.
std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials(const HttpServerOptions& http);

// AddPeerTlsFlags registers --tls-cert, --tls-key and --tls-ca of a service that only other
// services call (prefill, decode, encoder, kvstore): mTLS with the cluster CA, all three or none.
void AddPeerTlsFlags(CLI::App& app, PeerTlsOptions& tls);

// AddRouterCaFlag registers the router's --tls-ca (needs --tls-cert): mTLS with the workers.
void AddRouterCaFlag(CLI::App& app, std::string& ca_file);

// AddServeCaFlag registers `sluice serve`'s --tls-ca (needs --tls-cert): mTLS with the
// --kvstore shards.
void AddServeCaFlag(CLI::App& app, std::string& ca_file);

// PeerTlsFromPublic: mTLS towards other services for a process whose public listener
// certificate (http's --tls-cert/--tls-key) is also its identity as a client, trusting
// `ca_file`; `whose` names the certificate in errors ("the router's"). Off (empty options)
// without `ca_file`. Errors: `ca_file` without a certificate ("--tls-ca needs --tls-cert ..."),
// and ValidatePeerTls's.
absl::StatusOr<PeerTlsOptions> PeerTlsFromPublic(const HttpServerOptions& http,
                                                 const std::string& ca_file, const char* whose);

// Scheme is "https" or "http".
inline const char* Scheme(const HttpServerOptions& http) {
  return http.tls_cert_file.empty() ? "http" : "https";
}

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_TLS_FLAGS_H_
