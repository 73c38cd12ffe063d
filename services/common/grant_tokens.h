// GrantTokens: unguessable tokens that authorize one KV transfer grant (a prefill worker's
// pinned blocks, a kvstore lease). The service that grants the blocks issues the token with the
// grant; whoever calls back about the grant (PushKv / Release on the prefill worker, PutCommit /
// Release on the kvstore) must present it, else the call is refused with PERMISSION_DENIED
// before any block is touched. So a peer reaches only the blocks granted to it, even inside
// the cluster (mTLS admits every member of the CA).
//
// A token is HMAC-SHA256(key, grant id), truncated to 128 bits, under a random key drawn when
// the issuer starts: the issuer is also the verifier, so it keeps no table of tokens and shares
// no secret, and tokens die with the process.
#ifndef SLUICE_SERVICES_COMMON_GRANT_TOKENS_H_
#define SLUICE_SERVICES_COMMON_GRANT_TOKENS_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace sluice {

class GrantTokens {
 public:
  static constexpr size_t kTokenBytes = 16;

  GrantTokens();  // a fresh random key (OpenSSL's CSPRNG); aborts if it has no entropy

  // Issue: the token of `grant_id` (a string naming the grant uniquely within this process,
  // e.g. "<request id>#<pin time>"; kTokenBytes raw bytes).
  std::string Issue(absl::string_view grant_id) const;

  // Check: OK when `token` is grant_id's (compared in constant time); else PERMISSION_DENIED
  // saying what was refused (`what`, e.g. "Release of request 'r1'").
  absl::Status Check(absl::string_view grant_id, absl::string_view token,
                     absl::string_view what) const;

 private:
  std::array<uint8_t, 32> key_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_GRANT_TOKENS_H_
