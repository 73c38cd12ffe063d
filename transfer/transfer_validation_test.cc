#include "transfer/transfer_validation.h"

#include <gtest/gtest.h>

#include <vector>

namespace sluice::transfer {
namespace {

struct Fixture {
  std::vector<char> k = std::vector<char>(8 * 64), v = std::vector<char>(8 * 32);
  std::vector<KvRegion> local = {{k.data(), 8, 64}, {v.data(), 8, 32}};
  RemoteKvDescriptor remote{"addr", {{0x1000, 6, 64, "k"}, {0x9000, 6, 32, "v"}}};
};

TEST(ValidateTransferTest, PairsValidRuns) {
  Fixture f;
  const std::vector<BlockRun> remote = {{0, 2}, {4, 2}}, local = {{3, 4}};
  auto pairs = ValidateTransfer(f.remote, remote, f.local, local);
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  EXPECT_EQ(*pairs, (std::vector<RunPair>{{0, 3, 2}, {4, 5, 2}}));
}

TEST(ValidateTransferTest, RejectsRegionCountMismatch) {
  Fixture f;
  const std::vector<BlockRun> runs = {{0, 1}};
  auto pairs = ValidateTransfer(f.remote, runs, absl::MakeConstSpan(f.local).subspan(0, 1), runs);
  ASSERT_EQ(pairs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(pairs.status().message().find("descriptor has 2 regions but 1 local"),
            std::string::npos);
}

TEST(ValidateTransferTest, RejectsBlockBytesMismatchAndNullBase) {
  Fixture f;
  const std::vector<BlockRun> runs = {{0, 1}};
  f.remote.regions[1].block_bytes = 64;
  EXPECT_EQ(ValidateTransfer(f.remote, runs, f.local, runs).status().code(),
            absl::StatusCode::kInvalidArgument);
  Fixture g;
  g.local[0].base = nullptr;
  auto null_base = ValidateTransfer(g.remote, runs, g.local, runs);
  EXPECT_NE(null_base.status().message().find("local base is null"), std::string::npos);
}

TEST(ValidateTransferTest, RejectsRunsPastEitherSide) {
  Fixture f;
  const std::vector<BlockRun> past_remote = {{5, 2}}, local = {{0, 2}};
  EXPECT_EQ(ValidateTransfer(f.remote, past_remote, f.local, local).status().code(),
            absl::StatusCode::kInvalidArgument);  // remote has 6 blocks
  const std::vector<BlockRun> remote = {{0, 2}}, past_local = {{7, 2}};
  EXPECT_EQ(ValidateTransfer(f.remote, remote, f.local, past_local).status().code(),
            absl::StatusCode::kInvalidArgument);  // local has 8 blocks
  const std::vector<BlockRun> three = {{0, 3}};
  EXPECT_EQ(ValidateTransfer(f.remote, three, f.local, local).status().code(),
            absl::StatusCode::kInvalidArgument);  // 3 blocks vs 2
}

}  // namespace
}  // namespace sluice::transfer
