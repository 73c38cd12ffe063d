#include "services/serve/tls_flags.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/str_cat.h"

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

void AddServeCaFlag(CLI::App& app, std::string& ca_file) {
  app.add_option("--tls-ca", ca_file,
                 "PEM CA certificate of the cluster: mTLS with the --kvstore shards, "
                 "--tls-cert/--tls-key being this server's identity (without it the kvstore is "
                 "reached in plaintext)");
}

absl::StatusOr<PeerTlsOptions> PeerTlsFromPublic(const HttpServerOptions& http,
                                                 const std::string& ca_file, const char* whose) {
  if (ca_file.empty()) return PeerTlsOptions{};
  if (http.tls_cert_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-ca needs --tls-cert and --tls-key (", whose, " certificate)"));
  }
  PeerTlsOptions tls{http.tls_cert_file, http.tls_key_file, ca_file};
  if (absl::Status valid = ValidatePeerTls(tls); !valid.ok()) return valid;
  return tls;
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
