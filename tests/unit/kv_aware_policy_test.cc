// KvAwarePolicy: exact cost terms, the fit rule, tie-breaks, and a hot shared prefix spreading
// over four workers once their queues feed back (vs. piling onto one with affinity alone).
#include "services/router/kv_aware_policy.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "engine/kv/block_hash.h"
#include "gtest/gtest.h"
#include "services/router/kv_index.h"

namespace sluice {
namespace {

KvCandidate Candidate(std::string id, int64_t cached_blocks, int64_t queued, int64_t running,
                      int64_t free_blocks, int64_t total_blocks = 100) {
  KvCandidate c;
  c.worker_id = std::move(id);
  c.cached_blocks = cached_blocks;
  c.queued_prefill_tokens = queued;
  c.running_requests = running;
  c.free_blocks = free_blocks;
  c.total_blocks = total_blocks;
  c.block_size = 16;
  return c;
}

TEST(KvAwarePolicyTest, CostTermsAreExact) {
  const KvAwarePolicyOptions options;  // queue 1, running 16, kv 1
  // P = 200, 8 cached blocks = 128 tokens, Q = 50, R = 2, usage = 1 - 75/100 = 0.25.
  KvCost cost = ComputeKvCost(options, Candidate("w", 8, 50, 2, 75), 200);
  EXPECT_EQ(cost.cached_tokens, 128);
  EXPECT_EQ(cost.new_tokens, 72);
  EXPECT_DOUBLE_EQ(cost.cost, 72 + 50 + 16 * 2 + 200 * 0.25);
  EXPECT_TRUE(cost.fits);
  // A fully cached prompt still computes its last token.
  cost = ComputeKvCost(options, Candidate("w", 20, 0, 0, 100), 160);
  EXPECT_EQ(cost.cached_tokens, 159);
  EXPECT_EQ(cost.new_tokens, 1);
  EXPECT_DOUBLE_EQ(cost.cost, 1.0);
  // The router's own outstanding assignments count when they exceed the reported load.
  KvCandidate lagging = Candidate("w", 0, 10, 1, 100);
  lagging.assigned_new_tokens = 300;
  lagging.assigned_requests = 3;
  EXPECT_DOUBLE_EQ(ComputeKvCost(options, lagging, 100).cost, 100 + 300 + 16 * 3);
}

TEST(KvAwarePolicyTest, OverlapWinsUntilLoadOutweighsIt) {
  const KvAwarePolicyOptions options;
  // w1 holds 16 of 20 blocks (256 tokens) of a 320-token prompt: cost 64 + Q; w2 none: 320.
  std::vector<KvCandidate> candidates = {Candidate("w1", 16, 0, 0, 100),
                                         Candidate("w2", 0, 0, 0, 100)};
  std::optional<KvChoice> choice = ChooseKvWorker(options, candidates, 320);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->worker_id, "w1");
  EXPECT_EQ(choice->cached_tokens, 256);
  EXPECT_EQ(choice->new_tokens, 64);
  candidates[0].queued_prefill_tokens = 255;  // 64 + 255 = 319 < 320
  EXPECT_EQ(ChooseKvWorker(options, candidates, 320)->worker_id, "w1");
  candidates[0].queued_prefill_tokens = 257;  // 321 > 320
  EXPECT_EQ(ChooseKvWorker(options, candidates, 320)->worker_id, "w2");
}

TEST(KvAwarePolicyTest, WorkersWithoutRoomRankLastAndTiesBreakByPicksThenId) {
  const KvAwarePolicyOptions options;
  // w1 is far cheaper (cached) but has 1 free block for 4 new blocks' worth of tokens.
  std::vector<KvCandidate> candidates = {Candidate("w1", 4, 0, 0, 1, 10),
                                         Candidate("w2", 0, 500, 5, 90, 100)};
  EXPECT_EQ(ChooseKvWorker(options, candidates, 128)->worker_id, "w2");
  // Nobody fits: the cheapest of them.
  candidates[1].free_blocks = 0;
  EXPECT_EQ(ChooseKvWorker(options, candidates, 128)->worker_id, "w1");
  // Equal costs: fewer picks, then the smaller id.
  std::vector<KvCandidate> tied = {Candidate("w3", 0, 0, 0, 100), Candidate("w2", 0, 0, 0, 100)};
  EXPECT_EQ(ChooseKvWorker(options, tied, 64)->worker_id, "w2");
  tied[1].picked_total = 1;
  EXPECT_EQ(ChooseKvWorker(options, tied, 64)->worker_id, "w3");
  EXPECT_FALSE(ChooseKvWorker(options, {}, 64).has_value());
}

// 100 requests share a 512-token system prompt (+ 64 tokens of their own) over 4 workers; four
// arrive per tick and each worker prefills 80 tokens per tick, so even with the prefix cached
// everywhere (4 * 64 new tokens per tick) no single worker keeps up: at least 4 * 64 / 80 = 3.2
// workers' worth of prefill is needed. The router records each decision
// in the KvIndex and sees each worker's queue (load feedback). Returns picks per worker and the
// total prefill tokens computed.
struct HotPrefixResult {
  std::map<std::string, int> picks;
  int64_t computed_tokens = 0;
};
HotPrefixResult RunHotPrefix(const KvAwarePolicyOptions& options) {
  constexpr int64_t kBlock = 16;
  constexpr int64_t kWorkers = 4;
  absl::Time now = absl::FromUnixSeconds(1000);
  KvIndex index(KvIndexOptions{absl::Seconds(10)}, [&now] { return now; });
  BlockHasher hasher(KvLayoutIdentity("m", kBlock, "f32", 2, 8, 8), kBlock);
  std::vector<std::string> ids;
  std::vector<int64_t> queue(kWorkers, 0);
  for (int64_t w = 0; w < kWorkers; ++w) {
    ids.push_back("w" + std::to_string(w));
    index.ApplySnapshot(ids.back(), KvSnapshot{static_cast<uint64_t>(w + 1), 0, {}});
  }
  HotPrefixResult result;
  for (int r = 0; r < 100; ++r) {
    if (r % 4 == 0) {  // one tick: every worker prefills up to 80 queued tokens
      for (int64_t& q : queue) q = std::max<int64_t>(q - 80, 0);
      now += absl::Milliseconds(100);
    }
    std::vector<int32_t> tokens(512, 7);  // the shared system prompt
    for (int i = 0; i < 64; ++i) tokens.push_back(1000 + r * 64 + i);
    std::vector<BlockHash> hashes;
    hasher.ExtendFullBlockHashes(hasher.RootHash(""), tokens, hashes);
    const std::map<std::string, int64_t> matched = index.MatchPrefix(hashes);
    std::vector<KvCandidate> candidates;
    for (int64_t w = 0; w < kWorkers; ++w) {
      KvCandidate c = Candidate(ids[w], 0, queue[w], 0, 1000, 1000);
      auto it = matched.find(ids[w]);
      if (it != matched.end()) c.cached_blocks = it->second;
      auto picked = result.picks.find(ids[w]);
      c.picked_total = picked == result.picks.end() ? 0 : picked->second;
      candidates.push_back(c);
    }
    const std::optional<KvChoice> choice =
        ChooseKvWorker(options, candidates, static_cast<int64_t>(tokens.size()));
    EXPECT_TRUE(choice.has_value());
    if (!choice) break;
    index.RecordRouting(choice->worker_id, hashes);
    const int64_t w = std::find(ids.begin(), ids.end(), choice->worker_id) - ids.begin();
    queue[w] += choice->new_tokens;
    result.computed_tokens += choice->new_tokens;
    ++result.picks[choice->worker_id];
  }
  return result;
}

TEST(KvAwarePolicyTest, HotPrefixSpreadsOverAllWorkersWithLoadFeedback) {
  const HotPrefixResult kv = RunHotPrefix(KvAwarePolicyOptions{});
  ASSERT_EQ(kv.picks.size(), 4u);
  int min_picks = 100, max_picks = 0;
  for (const auto& [id, n] : kv.picks) {
    min_picks = std::min(min_picks, n);
    max_picks = std::max(max_picks, n);
  }
  EXPECT_GE(min_picks, 20) << "a worker idled while the hot prefix piled up elsewhere";
  EXPECT_LE(max_picks, 30);
  // Each worker computes the 512-token prefix once; every other request only its own 64 tokens.
  EXPECT_EQ(kv.computed_tokens, 4 * 512 + 100 * 64);

  // Affinity alone (no load terms) sends all 100 to the first holder.
  const HotPrefixResult affinity = RunHotPrefix(KvAwarePolicyOptions{0.0, 0.0, 0.0});
  EXPECT_EQ(affinity.picks.size(), 1u);
  EXPECT_EQ(affinity.computed_tokens, 512 + 100 * 64);
}

}  // namespace
}  // namespace sluice
