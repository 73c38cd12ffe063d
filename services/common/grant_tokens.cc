#include "services/common/grant_tokens.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace sluice {

GrantTokens::GrantTokens() {
  if (RAND_bytes(key_.data(), static_cast<int>(key_.size())) != 1) {
    std::fprintf(stderr, "GrantTokens: no randomness for the token key\n");
    std::abort();
  }
}

std::string GrantTokens::Issue(absl::string_view grant_id) const {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
       reinterpret_cast<const unsigned char*>(grant_id.data()), grant_id.size(), mac, &mac_len);
  return std::string(reinterpret_cast<const char*>(mac), kTokenBytes);
}

absl::Status GrantTokens::Check(absl::string_view grant_id, absl::string_view token,
                                absl::string_view what) const {
  if (token.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " refused: the call carries no transfer token"));
  }
  const std::string expected = Issue(grant_id);
  if (token.size() != expected.size() ||
      CRYPTO_memcmp(token.data(), expected.data(), expected.size()) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " refused: wrong transfer token (not the one granted)"));
  }
  return absl::OkStatus();
}

}  // namespace sluice
