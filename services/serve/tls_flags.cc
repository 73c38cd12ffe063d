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
