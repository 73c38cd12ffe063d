// Checks on what a peer worker sends about KV blocks (services/worker_common/peer_kv_blocks.h):
// block runs out of int32 range, empty runs and runs covering more than the reservation are
// refused with InvalidArgument instead of reaching the transfer code; inputs found by
// tests/fuzz/worker_wire_fuzz.
#include "services/worker_common/peer_kv_blocks.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "transfer/block_runs.h"

namespace sluice {
namespace {

v1::KvBlocks Runs(std::vector<std::pair<uint32_t, uint32_t>> runs) {
  v1::KvBlocks kv;
  for (const auto& [first, num] : runs) {
    v1::BlockRun* r = kv.add_runs();
    r->set_first_block(first);
    r->set_num_blocks(num);
  }
  return kv;
}

TEST(PeerKvBlocksTest, RunsFromWireKeepsValidRuns) {
  auto runs = RunsFromWire(Runs({{4, 3}, {10, 1}}), 4);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ((*runs)[0].first_block, 4);
  EXPECT_EQ((*runs)[0].num_blocks, 3);
  EXPECT_EQ((*runs)[1].first_block, 10);
  EXPECT_EQ(transfer::TotalBlocks(*runs), 4);
  // The largest run that still ends at INT32_MAX.
  auto top = RunsFromWire(Runs({{std::numeric_limits<int32_t>::max() - 1, 2}}), 2);
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_TRUE(RunsFromWire(Runs({}), 0).ok());
}

TEST(PeerKvBlocksTest, RunsFromWireRefusesOutOfRangeRuns) {
  // num_blocks 0xFFFFFFFF read as int32 was -1: the decode worker then built a vector from
  // blocks.begin() to blocks.begin() - 1.
  for (const v1::KvBlocks& bad :
       {Runs({{0, 0xFFFFFFFFu}}), Runs({{0x80000000u, 1}}), Runs({{0, 0}}),
        Runs({{0x7FFFFFFFu, 2}}), Runs({{1, 2}, {0xFFFFFFFFu, 1}})}) {
    auto runs = RunsFromWire(bad, std::numeric_limits<int32_t>::max());
    ASSERT_FALSE(runs.ok()) << bad.DebugString();
    EXPECT_EQ(runs.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(runs.status().message().find("is invalid"), std::string::npos)
        << runs.status().message();
  }
}

TEST(PeerKvBlocksTest, RunsFromWireRefusesMoreThanReserved) {
  auto runs = RunsFromWire(Runs({{0, 3}, {8, 2}}), 4);
  ASSERT_FALSE(runs.ok());
  EXPECT_EQ(runs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runs.status().message(), "KV block runs cover more than 4 blocks");
}

TEST(PeerKvBlocksTest, FirstBlocksExpandsOnlyWhatIsUsed) {
  // A peer's destination of 2^31 - 1 blocks: the prefill worker used to expand every id
  // (8 GiB) before taking the few it needed.
  auto runs = RunsFromWire(Runs({{5, 2}, {0, 0x7FFFFFFFu}}), std::numeric_limits<int32_t>::max());
  ASSERT_FALSE(runs.ok());  // 2 + (2^31 - 1) blocks exceed the int32 total
  auto big = RunsFromWire(Runs({{5, 2}, {100, 0x7FFFFF00u}}), std::numeric_limits<int32_t>::max());
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(FirstBlocks(*big, 4), (std::vector<int32_t>{5, 6, 100, 101}));
  EXPECT_EQ(FirstBlocks(*big, 0), std::vector<int32_t>{});
  auto small = RunsFromWire(Runs({{3, 2}}), 10);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(FirstBlocks(*small, 5), (std::vector<int32_t>{3, 4}));
}

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
