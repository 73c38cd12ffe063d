#include "services/serve/tls_flags.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

namespace sluice {

void AddTlsFlags(CLI::App& app, HttpServerOptions& http) {
  auto* cert = app.add_option("--tls-cert", http.tls_cert_file,
                              "PEM certificate chain: serve HTTPS and gRPC over TLS (reloaded "
                              "when the file changes)")
                   ->check(CLI::ExistingFile);
  auto* key = app.add_option("--tls-key", http.tls_key_file, "PEM private key of --tls-cert")
                  ->check(CLI::ExistingFile);
  cert->needs(key);
  key->needs(cert);
}

void AddPeerTlsFlags(CLI::App& app, PeerTlsOptions& tls) {
  // The files are checked at start-up (ValidatePeerTls) for a message naming what is wrong.
  auto* cert = app.add_option("--tls-cert", tls.cert_file,
                              "PEM certificate chain of this service, issued by --tls-ca: mTLS "
                              "with the router and the other services (reloaded when changed)");
  auto* key = app.add_option("--tls-key", tls.key_file, "PEM private key of --tls-cert");
  auto* ca = app.add_option("--tls-ca", tls.ca_file,
                            "PEM CA certificate: callers and servers must present a "
                            "certificate it issued");
  cert->needs(key, ca);
  key->needs(cert, ca);
  ca->needs(cert, key);
}

void AddRouterCaFlag(CLI::App& app, std::string& ca_file) {
  app.add_option("--tls-ca", ca_file,
                 "PEM CA certificate of the cluster: mTLS with the workers, --tls-cert/--tls-key "
                 "being the router's identity; the Registry then admits only workers with a "
                 "certificate it issued (the Inference API still takes clients without one)");
}

std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials(const HttpServerOptions& http) {
  if (http.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  constexpr unsigned int kRefreshSeconds = 5;
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      http.tls_key_file, http.tls_cert_file, kRefreshSeconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace sluice
