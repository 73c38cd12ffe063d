// GrantTokens: a token verifies only for the grant it was issued for, by the issuer that issued
// it; forged, truncated, empty and foreign tokens are PERMISSION_DENIED naming the call.
#include "services/common/grant_tokens.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace sluice {
namespace {

TEST(GrantTokens, TokenVerifiesOnlyForItsGrant) {
  const GrantTokens tokens;
  const std::string token = tokens.Issue("pin r1#100");
  EXPECT_EQ(token.size(), GrantTokens::kTokenBytes);
  EXPECT_EQ(tokens.Issue("pin r1#100"), token);  // deterministic per issuer
  EXPECT_TRUE(tokens.Check("pin r1#100", token, "Release of request 'r1'").ok());

  const absl::Status other = tokens.Check("pin r1#101", token, "Release of request 'r1'");
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(other.message(),
            "Release of request 'r1' refused: wrong transfer token (not the one granted)");
  const absl::Status missing = tokens.Check("pin r1#100", "", "PushKv of request 'r1'");
  EXPECT_EQ(missing.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(missing.message(), "PushKv of request 'r1' refused: the call carries no transfer token");

  std::string flipped = token;
  flipped[GrantTokens::kTokenBytes - 1] ^= 0x01;
  EXPECT_EQ(tokens.Check("pin r1#100", flipped, "x").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(tokens.Check("pin r1#100", token.substr(0, 8), "x").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(tokens.Check("pin r1#100", token + "x", "x").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(GrantTokens, EachIssuerHasItsOwnKey) {
  const GrantTokens a, b;
  // Another process (or a restarted one) cannot mint this one's tokens.
  EXPECT_NE(a.Issue("kvstore lease 1"), b.Issue("kvstore lease 1"));
  EXPECT_EQ(b.Check("kvstore lease 1", a.Issue("kvstore lease 1"), "x").code(),
            absl::StatusCode::kPermissionDenied);
  // Distinct grants get distinct tokens.
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) seen.insert(a.Issue("kvstore lease " + std::to_string(i)));
  EXPECT_EQ(seen.size(), 1000u);
}

}  // namespace
}  // namespace sluice
