// Tensor and expert parallelism on the CPU (ranks as threads, CpuCommunicator): the logits of a
// replica split over N ranks equal the single-rank model's within 1e-4 (float32), and greedy
// decoding picks the same tokens, on shared/fixtures llama-tiny (TP) and deepseek-v3-tiny
// (TP of MLA + dense MLP; EP of routed experts with AllToAllV dispatch/combine, with and without
// EPLB redundant replicas). Prompts come from the fixtures' golden cases, run batched with
// chunked prefill and decode mixed in one step.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/parallel/cpu_communicator.h"
#include "engine/parallel/cpu_parallel_model.h"
#include "engine/parallel/eplb.h"
#include "tests/util/golden_runner.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

using ::sluice::testing::GoldenRun;
using ::sluice::testing::GoldenRunOptions;

constexpr float kTolerance = 1e-4f;  // max |Δlogit|, float32 (only the summation order differs)

std::vector<std::vector<int32_t>> Prompts(const std::string& dir) {
  auto cases = sluice::testing::LoadGoldenCases(dir + "/golden.safetensors");
  EXPECT_TRUE(cases.ok()) << cases.status();
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; cases.ok() && i < cases->size() && i < 3; ++i) {
    prompts.push_back((*cases)[i].input_ids);
  }
  return prompts;
}

GoldenRunOptions Options() {
  GoldenRunOptions opt;
  opt.block_size = 4;
  opt.prefill_chunk = 5;
  opt.num_new_tokens = 8;
  return opt;
}

std::vector<GoldenRun> Run(Model& model, const std::vector<std::vector<int32_t>>& prompts) {
  auto runs = sluice::testing::RunGreedyBatch(model, prompts, Options());
  EXPECT_TRUE(runs.ok()) << runs.status();
  return runs.ok() ? *runs : std::vector<GoldenRun>{};
}

// ExpectSameAsSingleRank runs the prompts through `parallel` and through the unsplit model and
// compares every logit and greedy token.
void ExpectSameAsSingleRank(const std::string& fixture, const CpuParallelOptions& options) {
  const std::string dir = sluice::testing::FixtureDir(fixture);
  const auto prompts = Prompts(dir);
  ASSERT_FALSE(prompts.empty());
  auto single = LoadModel(dir);
  ASSERT_TRUE(single.ok()) << single.status();
  auto parallel = LoadCpuParallelModel(dir, options);
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  const std::vector<GoldenRun> want = Run(**single, prompts);
  const std::vector<GoldenRun> got = Run(**parallel, prompts);
  ASSERT_EQ(got.size(), want.size());
  for (size_t p = 0; p < want.size(); ++p) {
    ASSERT_EQ(got[p].logits.size(), want[p].logits.size());
    float max_diff = 0;
    for (size_t i = 0; i < want[p].logits.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(got[p].logits[i] - want[p].logits[i]));
    }
    EXPECT_LT(max_diff, kTolerance) << fixture << " prompt " << p;
    std::cout << fixture << " world " << options.world_size << " prompt " << p << ": max |dlogit| "
              << max_diff << "\n";
    EXPECT_EQ(got[p].greedy, want[p].greedy) << fixture << " prompt " << p;
  }
}

CpuParallelOptions Tp(int32_t n) {
  CpuParallelOptions o;
  o.world_size = n;
  return o;
}

CpuParallelOptions Ep(int32_t n, bool tensor_parallel_attention = true) {
  CpuParallelOptions o;
  o.world_size = n;
  o.tensor_parallel = tensor_parallel_attention;
  o.expert_parallel = true;
  return o;
}

TEST(TensorParallelTest, LlamaTinyTp2) { ExpectSameAsSingleRank("llama-tiny", Tp(2)); }
// 4 query heads, 2 KV heads: each rank keeps one query head and a replica of its KV head.
TEST(TensorParallelTest, LlamaTinyTp4) { ExpectSameAsSingleRank("llama-tiny", Tp(4)); }
TEST(TensorParallelTest, DeepseekV3TinyTp2) { ExpectSameAsSingleRank("deepseek-v3-tiny", Tp(2)); }
TEST(TensorParallelTest, DeepseekV3TinyTp4) { ExpectSameAsSingleRank("deepseek-v3-tiny", Tp(4)); }

// Attention (MLA) and the dense layer tensor-parallel, routed experts expert-parallel.
TEST(ExpertParallelTest, DeepseekV3TinyEp2) { ExpectSameAsSingleRank("deepseek-v3-tiny", Ep(2)); }
TEST(ExpertParallelTest, DeepseekV3TinyEp4) { ExpectSameAsSingleRank("deepseek-v3-tiny", Ep(4)); }
// Attention replicated on every rank, experts sharded.
TEST(ExpertParallelTest, DeepseekV3TinyEp2ReplicatedAttention) {
  ExpectSameAsSingleRank("deepseek-v3-tiny", Ep(2, /*tensor_parallel_attention=*/false));
}

// EPLB placement with redundant replicas: 8 experts + 4 redundant over 4 ranks (3 slots each),
// planned from a skewed load; tokens of a replicated expert are spread over its replicas.
TEST(ExpertParallelTest, DeepseekV3TinyEp4WithEplbReplicas) {
  const std::vector<double> load = {900, 50, 400, 60, 30, 200, 80, 20};
  auto placement = PlanEplb(load, {.num_ranks = 4, .num_redundant_experts = 4});
  ASSERT_TRUE(placement.ok()) << placement.status();
  // Replicas: expert 0 (900) gets 3 of the 4 extra slots (450, 300, then 225 after expert 2's
  // 400 → 200), so it sits on every rank; expert 2 gets one.
  ASSERT_EQ(placement->logical_to_physical[0].size(), 4u);
  ASSERT_EQ(placement->logical_to_physical[2].size(), 2u);
  CpuParallelOptions o = Ep(4);
  o.expert_slots = placement->physical_to_logical;
  ExpectSameAsSingleRank("deepseek-v3-tiny", o);
}

// One-sequence step over blocks 0, 1, ... of block_size 4: `tokens` at positions
// context.. context + tokens.size(), logits of the last one.
ForwardInput Step(const std::vector<int32_t>& tokens, int32_t context,
                  const std::vector<int32_t>& blocks) {
  ForwardInput in;
  in.token_ids = tokens;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t pos = context + static_cast<int32_t>(i);
    in.positions.push_back(pos);
    in.slot_mapping.push_back(int64_t{blocks[pos / 4]} * 4 + pos % 4);
  }
  in.sequences = {{0, static_cast<int32_t>(tokens.size()), context, absl::MakeConstSpan(blocks)}};
  in.logits_indices = {static_cast<int32_t>(tokens.size()) - 1};
  return in;
}

// EPLB between steps of a sequence in flight: measure the expert load of the prefill, move to
// an EPLB placement with 4 redundant replicas (weights move between ranks), decode, rebalance
// again on the decode load, decode on. Every step's logits equal the single-rank model's.
TEST(ExpertParallelTest, DeepseekV3TinyRebalanceBetweenSteps) {
  const std::string dir = sluice::testing::FixtureDir("deepseek-v3-tiny");
  const auto prompts = Prompts(dir);
  ASSERT_FALSE(prompts.empty());
  auto single = LoadModel(dir);
  ASSERT_TRUE(single.ok()) << single.status();
  auto parallel = LoadCpuParallelModel(dir, Ep(4));
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  const int64_t vocab = (*single)->config().vocab_size;
  const std::vector<int32_t> blocks = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  KvCache single_cache((*single)->kv_cache_spec(), 16, 4);
  KvCache parallel_cache((*parallel)->kv_cache_spec(), 16, 4);
  std::vector<int32_t> tokens = prompts[0];
  ASSERT_LT(tokens.size() + 6, blocks.size() * 4);
  int32_t context = 0;
  ExpertPlacement placement = *ContiguousPlacement(8, 4);
  const EplbOptions options{.num_ranks = 4, .num_redundant_experts = 4};
  for (int step = 0; step < 6; ++step) {
    const ForwardInput in = Step(tokens, context, blocks);
    std::vector<float> want(vocab), got(vocab);
    ASSERT_TRUE((*single)->Forward(in, single_cache, absl::MakeSpan(want)).ok());
    ASSERT_TRUE((*parallel)->Forward(in, parallel_cache, absl::MakeSpan(got)).ok());
    float max_diff = 0;
    for (int64_t v = 0; v < vocab; ++v) max_diff = std::max(max_diff, std::fabs(got[v] - want[v]));
    EXPECT_LT(max_diff, kTolerance) << "step " << step;
    const int32_t next = sluice::testing::ArgMax(want.data(), vocab);
    EXPECT_EQ(sluice::testing::ArgMax(got.data(), vocab), next) << "step " << step;
    context += static_cast<int32_t>(tokens.size());
    // 2 MoE layers x top-2 experts per token.
    const std::vector<int64_t> load = (*parallel)->TakeExpertLoad();
    ASSERT_EQ(load.size(), 8u);
    int64_t routed = 0;
    for (int64_t x : load) routed += x;
    EXPECT_EQ(routed, 2 * 2 * static_cast<int64_t>(tokens.size())) << "step " << step;
    tokens = {next};
    if (step != 0 && step != 3) continue;
    const std::vector<double> measured(load.begin(), load.end());
    if (step == 0) {
      auto planned = PlanEplb(measured, options);
      ASSERT_TRUE(planned.ok()) << planned.status();
      placement = *planned;
    } else {
      // Always apply (min_improvement -1): exercise the moves whatever the gain.
      auto plan = PlanRebalance(placement, measured, options, -1.0);
      ASSERT_TRUE(plan.ok()) << plan.status();
      placement = plan->placement;
    }
    ASSERT_TRUE((*parallel)->UpdateExpertPlacement(placement.physical_to_logical).ok());
  }
  EXPECT_EQ((*single)->UpdateExpertPlacement({}).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ParallelShardTest, RejectsIndivisibleAndUnsupportedSplits) {
  const std::string llama = sluice::testing::FixtureDir("llama-tiny");
  const std::string dsv3 = sluice::testing::FixtureDir("deepseek-v3-tiny");
  auto tp3 = LoadCpuParallelModel(llama, Tp(3));  // 4 heads
  EXPECT_EQ(tp3.status().code(), absl::StatusCode::kInvalidArgument) << tp3.status();
  EXPECT_NE(tp3.status().message().find("num_attention_heads"), std::string::npos);
  auto llama_ep = LoadCpuParallelModel(llama, Ep(2));
  EXPECT_EQ(llama_ep.status().code(), absl::StatusCode::kInvalidArgument) << llama_ep.status();
  auto ep3 = LoadCpuParallelModel(dsv3, Ep(3, false));  // 8 experts
  EXPECT_EQ(ep3.status().code(), absl::StatusCode::kInvalidArgument) << ep3.status();
  CpuParallelOptions missing_expert = Ep(2);
  missing_expert.expert_slots = {0, 1, 2, 3, 4, 5, 6, 6};  // expert 7 has no slot
  EXPECT_EQ(LoadCpuParallelModel(dsv3, missing_expert).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A bad request fails on every rank before any collective and leaves the replica usable.
TEST(ParallelShardTest, InvalidInputKeepsReplicaUsable) {
  const std::string dir = sluice::testing::FixtureDir("deepseek-v3-tiny");
  auto parallel = LoadCpuParallelModel(dir, Ep(2));
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  Model& model = **parallel;
  KvCache cache(model.kv_cache_spec(), 4, 4);
  const int32_t blocks[] = {0};
  ForwardInput in;
  in.token_ids = {static_cast<int32_t>(model.config().vocab_size)};  // out of range
  in.positions = {0};
  in.slot_mapping = {0};
  in.sequences = {{0, 1, 0, absl::MakeConstSpan(blocks)}};
  in.logits_indices = {0};
  std::vector<float> logits(model.config().vocab_size);
  EXPECT_EQ(model.Forward(in, cache, absl::MakeSpan(logits)).code(),
            absl::StatusCode::kInvalidArgument);
  in.token_ids = {3};
  EXPECT_TRUE(model.Forward(in, cache, absl::MakeSpan(logits)).ok());
}

TEST(ParallelShardTest, ShardingTwiceIsFailedPrecondition) {
  for (const char* fixture : {"llama-tiny", "deepseek-v3-tiny"}) {
    auto model = LoadModel(sluice::testing::FixtureDir(fixture));
    ASSERT_TRUE(model.ok()) << model.status();
    auto group = CpuCommunicatorGroup::Create(2);
    ASSERT_TRUE(group.ok());
    ParallelShard shard{.rank = 0, .world_size = 2, .comm = (*group)->communicator(0)};
    ASSERT_TRUE((*model)->Shard(shard).ok()) << fixture;
    EXPECT_EQ((*model)->Shard(shard).code(), absl::StatusCode::kFailedPrecondition) << fixture;
  }
}

}  // namespace
}  // namespace sluice
