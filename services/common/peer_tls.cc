#include "services/common/peer_tls.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/server_context.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

// How often gRPC's file watcher re-reads the files (certificate rotation).
constexpr unsigned int kRefreshSeconds = 5;

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "not PEM";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

absl::StatusOr<File> Open(const std::string& path, const char* what) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat("mTLS needs ", what));
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", what, " '", path, "': ", std::strerror(errno)));
  }
  return File(f);
}

using X509Ptr = std::unique_ptr<X509, decltype(&X509_free)>;

// ReadCertificates: every certificate in a PEM file (at least one).
absl::StatusOr<std::vector<X509Ptr>> ReadCertificates(const std::string& path,
                                                      const char* what) {
  absl::StatusOr<File> file = Open(path, what);
  if (!file.ok()) return file.status();
  std::vector<X509Ptr> certs;
  ERR_clear_error();
  while (X509* cert = PEM_read_X509(file->get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(cert, X509_free);
  }
  ERR_clear_error();  // the end of the file reads as an error
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' holds no PEM certificate"));
  }
  return certs;
}

}  // namespace

absl::Status ValidatePeerTls(const PeerTlsOptions& options) {
  if (!options.enabled()) {
    if (!options.cert_file.empty() || !options.key_file.empty()) {
      return absl::InvalidArgumentError(
          "mTLS between services needs the CA too (--tls-ca with --tls-cert and --tls-key)");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<X509Ptr>> ca = ReadCertificates(options.ca_file, "CA file (--tls-ca)");
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::vector<X509Ptr>> chain =
      ReadCertificates(options.cert_file, "certificate (--tls-cert)");
  if (!chain.ok()) return chain.status();
  absl::StatusOr<File> key_file = Open(options.key_file, "private key (--tls-key)");
  if (!key_file.ok()) return key_file.status();
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_PrivateKey(key_file->get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("private key (--tls-key) '", options.key_file,
                                                   "' is unusable: ", OpenSslError()));
  }
  X509* leaf = chain->front().get();
  if (X509_check_private_key(leaf, key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("private key '", options.key_file,
                                                   "' does not match certificate '",
                                                   options.cert_file, "'"));
  }
  // The certificate must chain to the CA: peers would refuse it at every handshake otherwise.
  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(X509_STORE_new(),
                                                                X509_STORE_free);
  for (const X509Ptr& c : *ca) X509_STORE_add_cert(store.get(), c.get());
  std::unique_ptr<STACK_OF(X509), void (*)(STACK_OF(X509)*)> intermediates(
      sk_X509_new_null(), [](STACK_OF(X509)* s) { sk_X509_free(s); });
  for (size_t i = 1; i < chain->size(); ++i) sk_X509_push(intermediates.get(), (*chain)[i].get());
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> ctx(X509_STORE_CTX_new(),
                                                                      X509_STORE_CTX_free);
  if (X509_STORE_CTX_init(ctx.get(), store.get(), leaf, intermediates.get()) != 1) {
    return absl::InternalError(absl::StrCat("certificate check: ", OpenSslError()));
  }
  if (X509_verify_cert(ctx.get()) != 1) {
    const int error = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        "certificate '", options.cert_file, "' does not verify against CA '", options.ca_file,
        "': ", X509_verify_cert_error_string(error)));
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ChannelCredentials> PeerChannelCredentials(const PeerTlsOptions& options) {
  if (!options.enabled()) return grpc::InsecureChannelCredentials();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.key_file, options.cert_file, options.ca_file, kRefreshSeconds);
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(provider);
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  // The chain is verified against the CA during the handshake; the host-name check is left out
  // (peers are dialed at advertised IPs that certificates do not name).
  tls.set_verify_server_certs(true);
  tls.set_certificate_verifier(std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
  tls.set_check_call_host(false);
  return grpc::experimental::TlsCredentials(tls);
}

std::shared_ptr<grpc::ServerCredentials> PeerServerCredentials(const PeerTlsOptions& options,
                                                               ClientCertificates policy) {
  if (!options.enabled()) return grpc::InsecureServerCredentials();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.key_file, options.cert_file, options.ca_file, kRefreshSeconds);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_cert_request_type(policy == ClientCertificates::kRequire
                                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(tls);
}

bool HasVerifiedPeerCertificate(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return false;
  // A TLS connection without a client certificate has no x509 properties.
  return !auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME).empty();
}

}  // namespace sluice
