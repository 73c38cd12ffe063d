// EPLB placement: exact placements on small hand-computed cases, imbalance on recorded skewed loads
// versus the naive contiguous layout, replica routing, rebalance moves, errors.
#include "engine/parallel/eplb.h"

#include <cmath>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace sluice {
namespace {

double ImbalanceOf(const ExpertPlacement& p, const std::vector<double>& load) {
  auto loads = RankLoads(p, load);
  EXPECT_TRUE(loads.ok()) << loads.status();
  return Imbalance(*loads);
}

// Every logical expert has a replica, slots are filled, and the two maps agree.
void ExpectConsistent(const ExpertPlacement& p) {
  ASSERT_EQ(p.physical_to_logical.size(), static_cast<size_t>(p.num_ranks * p.slots_per_rank));
  ASSERT_EQ(p.logical_to_physical.size(), static_cast<size_t>(p.num_logical_experts));
  size_t replicas = 0;
  for (int32_t e = 0; e < p.num_logical_experts; ++e) {
    ASSERT_FALSE(p.logical_to_physical[e].empty()) << "expert " << e;
    for (int32_t slot : p.logical_to_physical[e]) EXPECT_EQ(p.physical_to_logical[slot], e);
    replicas += p.logical_to_physical[e].size();
  }
  EXPECT_EQ(replicas, p.physical_to_logical.size());
}

TEST(EplbTest, ExactPlacementWithRedundantReplicas) {
  // Loads 8, 4, 2, 2 on 2 ranks with 2 redundant slots (3 slots per rank). Replicate: expert 0 (8)
  // gets a 2nd replica (8/2 = 4 ties expert 1's 4; the lower id wins the next one too), so replicas
  // [3, 1, 1, 1], per-replica loads 8/3, 4, 2, 2. Pack (heaviest first, lightest rank with room,
  // prefer ranks without that expert):
  //   e1→r0 (4), e0→r1 (8/3), e0→r0 (r1 holds e0) 20/3, e0→r1 16/3, e2→r1 22/3
  //   (full), e3→r0.
  const std::vector<double> load = {8, 4, 2, 2};
  auto p = PlanEplb(load, {.num_ranks = 2, .num_redundant_experts = 2});
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectConsistent(*p);
  EXPECT_EQ(p->slots_per_rank, 3);
  EXPECT_EQ(p->physical_to_logical, (std::vector<int32_t>{0, 1, 3, 0, 0, 2}));
  EXPECT_EQ(p->logical_to_physical[0], (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(p->logical_to_physical[1], (std::vector<int32_t>{1}));
  EXPECT_EQ(p->RankExperts(1), (std::vector<int32_t>{0, 0, 2}));
  auto rank_loads = RankLoads(*p, load);
  ASSERT_TRUE(rank_loads.ok());
  EXPECT_NEAR((*rank_loads)[0], 8.0 / 3 + 4 + 2, 1e-12);
  EXPECT_NEAR((*rank_loads)[1], 16.0 / 3 + 2, 1e-12);
  EXPECT_NEAR(Imbalance(*rank_loads), (8.0 / 3 + 6) / 8, 1e-12);
  auto naive = ContiguousPlacement(4, 2);
  ASSERT_TRUE(naive.ok());
  EXPECT_DOUBLE_EQ(ImbalanceOf(*naive, load),
                   1.5);  // ranks {0,1}=12 and {2,3}=4
}

TEST(EplbTest, ExactPlacementWithoutRedundancy) {
  // 5, 4, 2, 1 on 2 ranks: e0→r0, e1→r1, e2→r1 (4 < 5), e3→r0: both ranks carry 6.
  const std::vector<double> load = {5, 4, 2, 1};
  auto p = PlanEplb(load, {.num_ranks = 2});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->physical_to_logical, (std::vector<int32_t>{0, 3, 1, 2}));
  EXPECT_DOUBLE_EQ(ImbalanceOf(*p, load), 1.0);
  auto naive = ContiguousPlacement(4, 2);
  EXPECT_DOUBLE_EQ(ImbalanceOf(*naive, load), 1.5);
}

// Recorded skewed loads: Zipf(s = 1.2) over 64 experts (tokens per expert of a window of 100k
// routed tokens, ranked by a fixed permutation so hot experts are not all on rank 0), and a uniform
// load with one hot expert at 20x the mean.
std::vector<double> ZipfLoad() {
  std::vector<double> load(64);
  double z = 0;
  for (int i = 0; i < 64; ++i) z += 1.0 / std::pow(i + 1, 1.2);
  for (int i = 0; i < 64; ++i) {
    load[(i * 37) % 64] = std::round(100000.0 / std::pow(i + 1, 1.2) / z);
  }
  return load;
}

std::vector<double> HotExpertLoad() {
  // 31 experts at 100 tokens and expert 5 at 20x the mean of all 32. mean = (3100 + h) / 32 and h =
  // 20 mean  =>  h = 20 * 3100 / 12 = 5166.67.
  std::vector<double> load(32, 100.0);
  load[5] = 20.0 * 3100.0 / 12.0;
  return load;
}

TEST(EplbTest, ZipfLoadIsBalancedFarBetterThanContiguous) {
  const std::vector<double> load = ZipfLoad();
  auto naive = ContiguousPlacement(64, 8);
  ASSERT_TRUE(naive.ok());
  auto p = PlanEplb(load, {.num_ranks = 8, .num_redundant_experts = 16});
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectConsistent(*p);
  const double before = ImbalanceOf(*naive, load), after = ImbalanceOf(*p, load);
  EXPECT_GT(before, 2.0);  // the hottest expert alone is ~17% of all tokens
  EXPECT_LT(after, before);
  EXPECT_LT(after, 1.05);
  // Without redundancy the hottest expert bounds the best achievable max load.
  auto no_redundancy = PlanEplb(load, {.num_ranks = 8});
  ASSERT_TRUE(no_redundancy.ok());
  EXPECT_LT(ImbalanceOf(*no_redundancy, load), before);
  EXPECT_LT(after, ImbalanceOf(*no_redundancy, load));
}

TEST(EplbTest, HotExpertAt20xMeanGetsReplicas) {
  const std::vector<double> load = HotExpertLoad();
  auto naive = ContiguousPlacement(32, 4);
  auto p = PlanEplb(load, {.num_ranks = 4, .num_redundant_experts = 4});
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectConsistent(*p);
  // All 4 redundant slots go to the hot expert (5166/5 = 1033 per replica still > 100).
  EXPECT_EQ(p->logical_to_physical[5].size(), 5u);
  const double before = ImbalanceOf(*naive, load), after = ImbalanceOf(*p, load);
  EXPECT_NEAR(before, (5166.67 + 700) / ((3100 + 5166.67) / 4), 1e-3);
  EXPECT_LT(after, before);
  // 5 hot replicas on 4 ranks: one rank holds two (2 x 1033 + 7 x 100), the others one hot replica
  // and 8 cold experts. Greedy replicate-then-pack cannot see that a 4th replica would balance
  // better — a known limit of the method; still 2.8x → 1.34.
  EXPECT_NEAR(after, (2 * load[5] / 5 + 700) / ((3100 + load[5]) / 4), 1e-9);
}

TEST(EplbTest, HierarchicalKeepsEachExpertInsideOneNode) {
  const std::vector<double> load = {90, 10, 10, 10, 40, 40, 5, 5};
  auto p = PlanEplb(load, {.num_ranks = 4, .num_redundant_experts = 4, .num_nodes = 2});
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectConsistent(*p);
  for (int32_t e = 0; e < 8; ++e) {
    std::set<int32_t> nodes;
    for (int32_t slot : p->logical_to_physical[e]) nodes.insert(p->RankOfSlot(slot) / 2);
    EXPECT_EQ(nodes.size(), 1u) << "expert " << e;
  }
  auto naive = ContiguousPlacement(8, 4);
  EXPECT_LT(ImbalanceOf(*p, load), ImbalanceOf(*naive, load));
}

TEST(EplbTest, ReplicaRouterPolicies) {
  auto p = PlanEplb(std::vector<double>{8, 4, 2, 2}, {.num_ranks = 2, .num_redundant_experts = 2});
  ASSERT_TRUE(p.ok());
  ReplicaRouter rr(&*p, ReplicaPolicy::kRoundRobin);
  std::vector<int32_t> got;
  for (int t = 0; t < 4; ++t) got.push_back(rr.PhysicalSlot(0, 100 + t));
  EXPECT_EQ(got, (std::vector<int32_t>{0, 3, 4, 0}));
  EXPECT_EQ(rr.PhysicalSlot(1, 7), 1);
  rr.Reset();
  EXPECT_EQ(rr.PhysicalSlot(0, 5), 0);
  ReplicaRouter by_token(&*p, ReplicaPolicy::kTokenIndex);
  EXPECT_EQ(by_token.PhysicalSlot(0, 5), 4);  // 5 % 3 = 2 → third replica
  EXPECT_EQ(by_token.PhysicalSlot(0, 5), 4);  // stateless
  EXPECT_EQ(by_token.PhysicalSlot(3, 5), 2);
}

TEST(EplbTest, RebalanceExactMoves) {
  auto current = ContiguousPlacement(4, 2);  // [0, 1 | 2, 3]
  ASSERT_TRUE(current.ok());
  // Fresh plan [0, 3 | 1, 2]; relabelled to keep e0 in slot 0 and e2 in slot 2: [0, 3 | 2, 1].
  auto plan = PlanRebalance(*current, std::vector<double>{5, 4, 2, 1}, {.num_ranks = 2});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->changed);
  EXPECT_DOUBLE_EQ(plan->old_imbalance, 1.5);
  EXPECT_DOUBLE_EQ(plan->new_imbalance, 1.0);
  EXPECT_EQ(plan->placement.physical_to_logical, (std::vector<int32_t>{0, 3, 2, 1}));
  EXPECT_EQ(plan->moves, (std::vector<ExpertMove>{{1, 3, 3}, {3, 1, 1}}));
  // Same load again: nothing to gain, nothing moves.
  auto again = PlanRebalance(plan->placement, std::vector<double>{5, 4, 2, 1}, {.num_ranks = 2});
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->changed);
  EXPECT_TRUE(again->moves.empty());
  EXPECT_EQ(again->placement.physical_to_logical, plan->placement.physical_to_logical);
}

TEST(EplbTest, RebalanceMovesTurnOldPlacementIntoNew) {
  const std::vector<double> first = ZipfLoad();
  auto current = PlanEplb(first, {.num_ranks = 8, .num_redundant_experts = 16});
  ASSERT_TRUE(current.ok());
  // The load shifts: the same Zipf shape over another permutation of the experts.
  std::vector<double> shifted(64);
  for (int e = 0; e < 64; ++e) shifted[(e * 5 + 3) % 64] = first[e];
  auto plan = PlanRebalance(*current, shifted, {.num_ranks = 8, .num_redundant_experts = 16});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->changed);
  ExpectConsistent(plan->placement);
  EXPECT_LT(plan->new_imbalance, plan->old_imbalance);
  // Applying the copies (sources read from the old slots) yields exactly the new placement, and
  // only slots whose expert changes are written.
  std::vector<int32_t> slots = current->physical_to_logical;
  for (const ExpertMove& m : plan->moves) {
    EXPECT_EQ(current->physical_to_logical[m.src_slot], m.logical);
    EXPECT_NE(current->physical_to_logical[m.dst_slot], m.logical);
    slots[m.dst_slot] = m.logical;
  }
  EXPECT_EQ(slots, plan->placement.physical_to_logical);
  // The relabelling saves copies compared to writing the fresh plan as it comes.
  auto fresh = PlanEplb(shifted, {.num_ranks = 8, .num_redundant_experts = 16});
  size_t naive_moves = 0;
  for (size_t s = 0; s < slots.size(); ++s) {
    naive_moves += fresh->physical_to_logical[s] != current->physical_to_logical[s];
  }
  EXPECT_LE(plan->moves.size(), naive_moves);
}

TEST(EplbTest, Errors) {
  const std::vector<double> load = {1, 2, 3, 4};
  EXPECT_EQ(PlanEplb(load, {.num_ranks = 3}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanEplb(load, {.num_ranks = 2, .num_redundant_experts = 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanEplb(load, {.num_ranks = 2, .num_nodes = 3}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanEplb(std::vector<double>{1, -1}, {.num_ranks = 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanEplb(std::vector<double>{1, NAN}, {.num_ranks = 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanEplb({}, {.num_ranks = 1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ContiguousPlacement(6, 4).status().code(), absl::StatusCode::kInvalidArgument);
  auto p = ContiguousPlacement(4, 2);
  EXPECT_EQ(RankLoads(*p, std::vector<double>{1, 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanRebalance(*p, load, {.num_ranks = 2, .num_redundant_experts = 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice
