// Checks on what a peer worker sends about KV blocks (services/common/peer_kv_blocks.h):
// a descriptor that does not parse is refused with InvalidArgument instead of reaching the
// transfer code (its block runs: transfer/block_runs_wire_test.cc).
#include "services/common/peer_kv_blocks.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sluice {
namespace {

TEST(PeerKvBlocksTest, ParseTransferRegionsRefusesGarbage) {
  std::vector<uint8_t> arena(4096);
  std::vector<transfer::KvRegion> local = {{arena.data(), 4, 1024}};
  for (const std::string& bytes : {std::string(), std::string("\x00\x01\x02", 3),
                                   std::string(64, '\xff')}) {
    auto moved = ParseTransferRegions(bytes, local, {0});
    ASSERT_FALSE(moved.ok());
    EXPECT_EQ(moved.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace sluice
