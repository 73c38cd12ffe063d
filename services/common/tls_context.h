// TlsContextSource: the server-side TLS context of a listener, built from a certificate chain
// and a private key in PEM files, rebuilt when either file changes (certificate rotation, e.g.
// cert-manager rewriting a mounted Secret) without a restart. Connections keep the context they
// started with.
#ifndef SLUICE_SERVICES_COMMON_TLS_CONTEXT_H_
#define SLUICE_SERVICES_COMMON_TLS_CONTEXT_H_

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include <boost/asio/ssl/context.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"

namespace sluice {

class TlsContextSource {
 public:
  // Create loads the files (TLS 1.2+, the certificate must match the key). Errors:
  // InvalidArgument naming the file that could not be used.
  static absl::StatusOr<std::unique_ptr<TlsContextSource>> Create(std::string cert_file,
                                                                  std::string key_file);

  // Current returns the context for a new connection. At most once per `check_period` it
  // compares the files' modification times with those loaded and reloads on a change; a
  // reload that fails keeps the previous context (and is retried at the next change).
  // Thread-safe.
  std::shared_ptr<boost::asio::ssl::context> Current();

  // num_reloads counts successful reloads after the first load.
  int num_reloads() const;

  std::chrono::milliseconds check_period{1000};

 private:
  TlsContextSource(std::string cert_file, std::string key_file)
      : cert_file_(std::move(cert_file)), key_file_(std::move(key_file)) {}
  // Load builds a context from the files as they are now.
  absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> Load() const;
  std::string Stamp() const;  // both files' mtimes and sizes

  const std::string cert_file_;
  const std::string key_file_;
  mutable std::mutex mu_;
  std::shared_ptr<boost::asio::ssl::context> context_ ABSL_GUARDED_BY(mu_);
  std::string stamp_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_check_ ABSL_GUARDED_BY(mu_);
  int num_reloads_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_TLS_CONTEXT_H_
