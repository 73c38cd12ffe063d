#include "services/api/auth/api_auth.h"

#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "services/api/auth/sha256.h"

namespace sluice {

absl::StatusOr<std::unique_ptr<ApiAuth>> ApiAuth::Create(const ApiAuthOptions& options) {
  std::unique_ptr<ApiAuth> auth(new ApiAuth(options));
  if (absl::Status status = auth->Reload(); !status.ok()) return status;
  return auth;
}

absl::Status ApiAuth::Reload() {
  std::vector<ApiKey> keys;
  if (!options_.api_keys_file.empty()) {
    absl::StatusOr<std::vector<ApiKey>> loaded = LoadApiKeysFile(options_.api_keys_file);
    if (!loaded.ok()) return loaded.status();
    keys = *std::move(loaded);
  }
  if (!options_.api_key.empty()) {
    ApiKey plain;
    plain.sha256 = Sha256Hex(options_.api_key);
    plain.name = "--api-key";
    bool listed = false;
    for (const ApiKey& k : keys) listed = listed || k.sha256 == plain.sha256;
    if (!listed) keys.push_back(std::move(plain));
  }
  store_.Replace(std::move(keys));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const ApiKey>> ApiAuth::Authenticate(
    std::string_view authorization) const {
  // Debian's Abseil has its own string_view type.
  absl::string_view key =
      absl::StripAsciiWhitespace(absl::string_view(authorization.data(), authorization.size()));
  if (key.size() >= 7 && absl::EqualsIgnoreCase(key.substr(0, 7), "bearer ")) {
    key = absl::StripLeadingAsciiWhitespace(key.substr(7));
  }
  if (key.empty()) {
    return absl::UnauthenticatedError(
        "You didn't provide an API key. You need to provide your API key in an Authorization "
        "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).");
  }
  // Lookup is by digest: the comparison never touches the secret itself.
  std::shared_ptr<const ApiKey> found =
      store_.Find(Sha256Hex(std::string_view(key.data(), key.size())));
  if (found == nullptr) return absl::UnauthenticatedError("Incorrect API key provided.");
  return found;
}

}  // namespace sluice
