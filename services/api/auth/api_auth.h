// ApiAuth: authentication and quotas for the public API (HTTP and gRPC Inference).
//
// Keys come from --api-key (one plain key: no tenant, no limits) and/or --api-keys-file (hashed
// keys with tenants and limits, see api_key_store.h). Clients send `Authorization: Bearer <key>`
// (gRPC: the `authorization` metadata). A missing or unknown key is Unauthenticated; a request
// over one of its key's limits is ResourceExhausted carrying a Retry-After (quota_limiter.h).
// Reload re-reads the keys file (on SIGHUP); a file that fails to load leaves the old keys in
// place. Thread-safe.
#ifndef SLUICE_SERVICES_API_AUTH_API_AUTH_H_
#define SLUICE_SERVICES_API_AUTH_API_AUTH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "services/api/auth/api_key_store.h"
#include "services/api/auth/quota_limiter.h"

namespace sluice {

struct ApiAuthOptions {
  std::string api_key;         // a plain key accepted as is (empty: none)
  std::string api_keys_file;   // hashed keys file (empty: none)
  bool protect_metrics = false;  // /metrics needs a key too (/health never does)

  // enabled: whether any key source is configured (else the API is open).
  bool enabled() const { return !api_key.empty() || !api_keys_file.empty(); }
};

class ApiAuth {
 public:
  // Create loads the keys. Errors: the keys file's (NotFound, InvalidArgument).
  static absl::StatusOr<std::unique_ptr<ApiAuth>> Create(const ApiAuthOptions& options);

  // Authenticate checks an Authorization header value ("Bearer <key>"; a bare key is accepted
  // too). Unauthenticated when it is missing or names no accepted key.
  absl::StatusOr<std::shared_ptr<const ApiKey>> Authenticate(std::string_view authorization) const;

  // Admit charges a generation of `cost_tokens` (prompt + max_tokens × choices) to `key`.
  // ResourceExhausted with RetryAfterSeconds when over a limit. Hold the ticket until the
  // request is done.
  absl::StatusOr<std::unique_ptr<QuotaTicket>> Admit(const ApiKey& key, int64_t cost_tokens) {
    return limiter_.Admit(key, cost_tokens);
  }

  // Reload re-reads the keys file; on an error the previous keys stay. Returns the error.
  absl::Status Reload();

  bool protect_metrics() const { return options_.protect_metrics; }
  size_t num_keys() const { return store_.size(); }

 private:
  explicit ApiAuth(ApiAuthOptions options) : options_(std::move(options)) {}

  ApiAuthOptions options_;
  ApiKeyStore store_;
  QuotaLimiter limiter_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_AUTH_API_AUTH_H_
