#include "transfer/block_runs.h"

#include <vector>

#include "gtest/gtest.h"

namespace sluice::transfer {
namespace {

TEST(CoalesceBlocksTest, ScatteredIdsBecomeRunsInOrder) {
  const std::vector<int32_t> ids = {5, 6, 7, 20, 21, 40};
  EXPECT_EQ(CoalesceBlocks(ids), (std::vector<BlockRun>{{5, 3}, {20, 2}, {40, 1}}));
}

TEST(CoalesceBlocksTest, DescendingAndRepeatedIdsBreakRuns) {
  const std::vector<int32_t> ids = {3, 2, 2, 3, 4, 9};
  EXPECT_EQ(CoalesceBlocks(ids), (std::vector<BlockRun>{{3, 1}, {2, 1}, {2, 3}, {9, 1}}));
}

TEST(CoalesceBlocksTest, EmptyAndSingle) {
  EXPECT_TRUE(CoalesceBlocks({}).empty());
  const std::vector<int32_t> one = {0};
  EXPECT_EQ(CoalesceBlocks(one), (std::vector<BlockRun>{{0, 1}}));
}

TEST(CoalesceBlocksTest, ExpandIsInverse) {
  const std::vector<int32_t> ids = {9, 10, 0, 1, 2, 7, 100, 101};
  const std::vector<BlockRun> runs = CoalesceBlocks(ids);
  EXPECT_EQ(runs.size(), 4u);
  EXPECT_EQ(TotalBlocks(runs), 8);
  EXPECT_EQ(ExpandRuns(runs), ids);
}

TEST(PairRunsTest, SplitsWhereEitherSideBreaks) {
  const std::vector<BlockRun> remote = {{5, 3}, {20, 2}, {40, 1}};
  const std::vector<BlockRun> local = {{10, 6}};
  auto pairs = PairRuns(remote, local);
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  EXPECT_EQ(*pairs, (std::vector<RunPair>{{5, 10, 3}, {20, 13, 2}, {40, 15, 1}}));

  const std::vector<BlockRun> local2 = {{0, 2}, {50, 4}};
  pairs = PairRuns(remote, local2);
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  EXPECT_EQ(*pairs, (std::vector<RunPair>{{5, 0, 2}, {7, 50, 1}, {20, 51, 2}, {40, 53, 1}}));
}

TEST(PairRunsTest, RejectsMismatchedTotalsAndBadRuns) {
  const std::vector<BlockRun> a = {{0, 3}};
  const std::vector<BlockRun> b = {{0, 2}};
  EXPECT_EQ(PairRuns(a, b).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<BlockRun> negative = {{-1, 3}};
  EXPECT_EQ(PairRuns(negative, a).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<BlockRun> empty_run = {{4, 0}, {0, 3}};
  EXPECT_EQ(PairRuns(empty_run, a).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<BlockRun> overflow = {{2147483647, 3}};
  EXPECT_EQ(PairRuns(overflow, a).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(PairRuns({}, {}).ok());
}

}  // namespace
}  // namespace sluice::transfer
