// Sharding helpers (head/channel/token splits, row/column slicing) and the expert-parallel
// MoE pieces on CpuCommunicator ranks: ExpertParallelMoe against the unsharded MoeExpertsCpu
// (bit-exact, including ranks with no tokens and EPLB replicas), RedistributeExperts.
#include "engine/parallel/expert_parallel.h"

#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "engine/parallel/cpu_communicator.h"
#include "engine/parallel/eplb.h"
#include "engine/parallel/sharding.h"
#include "gtest/gtest.h"
#include "kernels/moe/moe_experts.h"

namespace sluice {
namespace {

bool operator==(const Range& a, const Range& b) { return a.begin == b.begin && a.count == b.count; }

TEST(ShardingTest, AttentionHeadsSplitOrReplicateKvHeads) {
  auto even = ShardAttentionHeads(8, 4, 1, 2);
  ASSERT_TRUE(even.ok());
  EXPECT_TRUE((even->q_heads == Range{4, 4}) && (even->kv_heads == Range{2, 2}));
  // 4 query heads, 2 KV heads, 4 ranks: rank 3 keeps query head 3 and KV head 1 (3 / 2).
  auto replicated = ShardAttentionHeads(4, 2, 3, 4);
  ASSERT_TRUE(replicated.ok());
  EXPECT_TRUE((replicated->q_heads == Range{3, 1}) && (replicated->kv_heads == Range{1, 1}));
  EXPECT_EQ(ShardAttentionHeads(4, 2, 0, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardAttentionHeads(12, 3, 0, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EvenShard(10, 0, 4, "x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EvenShard(8, 4, 4, "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardingTest, TokenShardCoversEveryTokenOnce) {
  // 5 tokens over 3 ranks: 2, 2, 1; 1 token over 4 ranks: 1, 0, 0, 0.
  EXPECT_TRUE((TokenShard(5, 0, 3) == Range{0, 2}));
  EXPECT_TRUE((TokenShard(5, 1, 3) == Range{2, 2}));
  EXPECT_TRUE((TokenShard(5, 2, 3) == Range{4, 1}));
  EXPECT_TRUE((TokenShard(1, 0, 4) == Range{0, 1}));
  EXPECT_TRUE((TokenShard(1, 3, 4) == Range{1, 0}));
}

TEST(ShardingTest, GatherRowsAndSliceColumns) {
  // w [4, 3] = 0..11.
  std::vector<float> w(12);
  for (int i = 0; i < 12; ++i) w[i] = static_cast<float>(i);
  const Range blocks[] = {{3, 1}, {0, 2}};
  EXPECT_EQ(GatherRows(w, 3, blocks), (std::vector<float>{9, 10, 11, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(SliceColumns(w, 4, 3, {1, 2}), (std::vector<float>{1, 2, 4, 5, 7, 8, 10, 11}));
  EXPECT_TRUE((Offset(Scale({1, 2}, 16), 64) == Range{80, 32}));
}

std::vector<absl::Status> RunRanks(CpuCommunicatorGroup& group,
                                   const std::function<absl::Status(int)>& body) {
  std::vector<absl::Status> status(group.world_size());
  std::vector<std::thread> threads;
  for (int r = 0; r < group.world_size(); ++r) {
    threads.emplace_back([&, r] { status[r] = body(r); });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

// Random experts, tokens and routing; each rank's ExpertParallelMoe output must equal the
// single-process MoeExpertsCpu output bit for bit.
struct MoeCase {
  int64_t hidden = 16, inter = 8, experts = 6, top_k = 2;
  std::vector<float> gate_up, down, x, weights;
  std::vector<int32_t> ids;
  MoeCase(int64_t tokens, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.3f);
    gate_up.resize(experts * 2 * inter * hidden);
    down.resize(experts * hidden * inter);
    x.resize(tokens * hidden);
    for (auto* v : {&gate_up, &down, &x}) {
      for (float& f : *v) f = normal(rng);
    }
    for (int64_t t = 0; t < tokens; ++t) {
      const int32_t a = static_cast<int32_t>(rng() % experts);
      const int32_t b = static_cast<int32_t>((a + 1 + rng() % (experts - 1)) % experts);
      ids.insert(ids.end(), {a, b});
      weights.insert(weights.end(), {0.7f, 0.3f});
    }
  }
  kernels::MoeExpertWeights Expert(int32_t e) const {
    return {gate_up.data() + e * 2 * inter * hidden, down.data() + e * hidden * inter};
  }
};

void ExpectMatchesUnsharded(int world, int64_t tokens, const std::vector<int32_t>& slots) {
  const MoeCase c(tokens, 7 + world);
  std::vector<kernels::MoeExpertWeights> all;
  for (int32_t e = 0; e < c.experts; ++e) all.push_back(c.Expert(e));
  std::vector<float> want(tokens * c.hidden);
  kernels::MoeWorkspace ws;
  ASSERT_TRUE(kernels::MoeExpertsCpu(c.x.data(), tokens, c.hidden, c.inter, c.ids.data(),
                                     c.weights.data(), c.top_k, all, want.data(), ws)
                  .ok());
  auto placement = PlacementFromSlots(slots, static_cast<int32_t>(c.experts), world);
  ASSERT_TRUE(placement.ok()) << placement.status();
  auto group = CpuCommunicatorGroup::Create(world, absl::Seconds(20));
  ASSERT_TRUE(group.ok());
  std::vector<std::vector<float>> got(world, std::vector<float>(tokens * c.hidden, -1.0f));
  std::vector<std::vector<int64_t>> load(world);
  auto status = RunRanks(**group, [&](int r) {
    std::vector<kernels::MoeExpertWeights> local;
    for (int32_t e : placement->RankExperts(r)) local.push_back(c.Expert(e));
    ExpertParallelMoe moe((*group)->communicator(r), *placement);
    absl::Status s = moe.Run(c.x.data(), tokens, c.hidden, c.inter, c.ids.data(), c.weights.data(),
                             c.top_k, local, got[r].data());
    load[r] = moe.load();
    return s;
  });
  std::vector<int64_t> total_load(c.experts, 0), want_load(c.experts, 0);
  for (int32_t id : c.ids) ++want_load[id];
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(got[r], want) << "rank " << r;
    for (int32_t e = 0; e < c.experts; ++e) total_load[e] += load[r][e];
  }
  EXPECT_EQ(total_load, want_load);
}

TEST(ExpertParallelMoeTest, MatchesUnshardedContiguous) {
  ExpectMatchesUnsharded(2, 7, {});
  ExpectMatchesUnsharded(3, 5, {});
}

TEST(ExpertParallelMoeTest, RanksWithoutTokens) { ExpectMatchesUnsharded(3, 1, {}); }

TEST(ExpertParallelMoeTest, RedundantReplicasSplitTheirTokens) {
  // 6 experts + 2 redundant (experts 0 and 3 twice) over 2 ranks of 4 slots.
  ExpectMatchesUnsharded(2, 9, {0, 1, 2, 3, 0, 3, 4, 5});
}

TEST(ExpertParallelMoeTest, BadExpertIdIsInvalidArgumentOnEveryRank) {
  auto placement = ContiguousPlacement(4, 2);
  auto group = CpuCommunicatorGroup::Create(2, absl::Seconds(20));
  const std::vector<float> x(2 * 4, 0.0f), w = {1.0f, 1.0f};
  const std::vector<int32_t> ids = {0, 9};  // token 1 (rank 1's share) is out of range
  auto status = RunRanks(**group, [&](int r) {
    ExpertParallelMoe moe((*group)->communicator(r), *placement);
    std::vector<float> out(2 * 4);
    std::vector<kernels::MoeExpertWeights> local(2);
    return moe.Run(x.data(), 2, 4, 2, ids.data(), w.data(), 1, local, out.data());
  });
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
}

// Expert e's weights are the floats {100 e, 100 e + 1}; after the move every rank holds exactly
// its new slots' experts.
TEST(RedistributeExpertsTest, MovesWeightsToTheNewSlots) {
  auto from = ContiguousPlacement(6, 3);                            // [0 1 | 2 3 | 4 5]
  auto to = PlacementFromSlots({5, 0, 2, 1, 4, 3, 0, 2, 5}, 6, 3);  // [5 0 2 | 1 4 3 | 0 2 5]
  ASSERT_TRUE(to.ok()) << to.status();
  auto group = CpuCommunicatorGroup::Create(3, absl::Seconds(20));
  std::vector<std::vector<float>> result(3);
  auto status = RunRanks(**group, [&](int r) {
    std::vector<float> local;
    for (int32_t e : from->RankExperts(r)) local.insert(local.end(), {100.0f * e, 100.0f * e + 1});
    auto moved = RedistributeExperts(*(*group)->communicator(r), *from, *to, local, 2);
    if (!moved.ok()) return moved.status();
    result[r] = *moved;
    return absl::OkStatus();
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    std::vector<float> want;
    for (int32_t e : to->RankExperts(r)) want.insert(want.end(), {100.0f * e, 100.0f * e + 1});
    EXPECT_EQ(result[r], want) << "rank " << r;
  }
  auto bad = RedistributeExperts(*(*group)->communicator(0), *from, *to, {1.0f}, 2);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice
