// ApiKeyStore: the API keys a server accepts, held only as SHA-256 digests, with each key's
// tenant and limits. The set is replaced atomically (SIGHUP reload): lookups in flight keep the
// snapshot they started with.
//
// Keys file (--api-keys-file), JSON:
//   {"keys": [{"sha256": "<64 hex digits: sha256 of the key>",
//              "name": "ops",                     // optional, for logs
//              "tenant": "acme",                  // optional; becomes the requests' cache_salt
//              "requests_per_second": 5,          // optional limits; absent or 0: unlimited
//              "tokens_per_minute": 20000,
//              "max_concurrent_requests": 4}]}
// A key's digest: `printf %s "$KEY" | sha256sum`. Unknown fields are errors (a typo in a limit
// must not silently lift it).
#ifndef SLUICE_SERVICES_API_AUTH_API_KEY_STORE_H_
#define SLUICE_SERVICES_API_AUTH_API_KEY_STORE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"

namespace sluice {

// ApiKeyLimits: per-key quotas; 0 means unlimited.
struct ApiKeyLimits {
  double requests_per_second = 0;       // sustained rate; bursts up to max(1, rate) requests
  int64_t tokens_per_minute = 0;        // prompt + max_tokens of each admitted request
  int32_t max_concurrent_requests = 0;  // generations in flight at once
};

// ApiKey: one accepted key.
struct ApiKey {
  std::string sha256;  // 64 lowercase hex digits
  std::string name;    // for logs; defaults to the digest's first 8 digits
  std::string tenant;  // empty: the request's own cache_salt is kept
  ApiKeyLimits limits;
};

// ParseApiKeysJson validates a keys file's contents. InvalidArgument names the offending key
// entry and field.
absl::StatusOr<std::vector<ApiKey>> ParseApiKeysJson(std::string_view text);

// LoadApiKeysFile reads and parses a keys file. NotFound / PermissionDenied when it cannot be
// read.
absl::StatusOr<std::vector<ApiKey>> LoadApiKeysFile(const std::string& path);

class ApiKeyStore {
 public:
  // Replace installs a new key set (digests must be unique). Thread-safe.
  void Replace(std::vector<ApiKey> keys);
  // Find returns the key with digest `sha256`, or null. Thread-safe.
  std::shared_ptr<const ApiKey> Find(const std::string& sha256) const;
  size_t size() const;

 private:
  using KeyMap = std::unordered_map<std::string, std::shared_ptr<const ApiKey>>;
  mutable std::mutex mu_;
  std::shared_ptr<const KeyMap> keys_ ABSL_GUARDED_BY(mu_) = std::make_shared<KeyMap>();
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_AUTH_API_KEY_STORE_H_
