// Block runs on the wire (transfer/block_runs_wire.h): ids go out as coalesced runs and come
// back; a peer's runs out of int32 range, empty runs and runs covering more than the
// reservation are refused with InvalidArgument instead of reaching the transfer code (inputs
// found by tests/fuzz/worker_wire_fuzz).
#include "transfer/block_runs_wire.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "transfer/block_runs.h"

namespace sluice::transfer {
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

TEST(BlockRunsWireTest, RunsToWireCoalescesAndRoundTrips) {
  const std::vector<int32_t> ids = {5, 6, 7, 20, 21, 40, std::numeric_limits<int32_t>::max()};
  v1::KvBlocks kv;
  RunsToWire(ids, &kv);
  ASSERT_EQ(kv.runs_size(), 4);
  EXPECT_EQ(kv.runs(0).first_block(), 5u);
  EXPECT_EQ(kv.runs(0).num_blocks(), 3u);
  EXPECT_EQ(kv.runs(1).first_block(), 20u);
  EXPECT_EQ(kv.runs(1).num_blocks(), 2u);
  EXPECT_EQ(kv.runs(3).first_block(), 2147483647u);
  EXPECT_EQ(kv.runs(3).num_blocks(), 1u);
  auto back = RunsFromWire(kv, static_cast<int64_t>(ids.size()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ExpandRuns(*back), ids);
  // Appends: a second call adds its runs after the first's.
  RunsToWire(std::vector<int32_t>{1}, &kv);
  ASSERT_EQ(kv.runs_size(), 5);
  EXPECT_EQ(kv.runs(4).first_block(), 1u);
  v1::KvBlocks empty;
  RunsToWire({}, &empty);
  EXPECT_EQ(empty.runs_size(), 0);
}

TEST(BlockRunsWireTest, RunsFromWireKeepsValidRuns) {
  auto runs = RunsFromWire(Runs({{4, 3}, {10, 1}}), 4);
  ASSERT_TRUE(runs.ok()) << runs.status();
  EXPECT_EQ(*runs, (std::vector<BlockRun>{{4, 3}, {10, 1}}));
  EXPECT_EQ(TotalBlocks(*runs), 4);
  // The largest run that still ends at INT32_MAX.
  auto top = RunsFromWire(Runs({{std::numeric_limits<int32_t>::max() - 1, 2}}), 2);
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_TRUE(RunsFromWire(Runs({}), 0).ok());
}

TEST(BlockRunsWireTest, RunsFromWireRefusesOutOfRangeRuns) {
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

TEST(BlockRunsWireTest, RunsFromWireRefusesMoreThanReserved) {
  auto runs = RunsFromWire(Runs({{0, 3}, {8, 2}}), 4);
  ASSERT_FALSE(runs.ok());
  EXPECT_EQ(runs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runs.status().message(), "KV block runs cover more than 4 blocks");
}

TEST(BlockRunsWireTest, FirstBlocksExpandsOnlyWhatIsUsed) {
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

}  // namespace
}  // namespace sluice::transfer
