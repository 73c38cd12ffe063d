// An engine without a host KV cache (EngineOptions::allocate_host_kv_cache = false), as
// `--device cuda` runs it: the model keeps its own KV store and reads only the geometry.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "engine/sched/llm_engine.h"
#include "tests/util/fake_models.h"

namespace sluice {
namespace {

using testing::ChecksumModel;

// OwnKvModel computes ChecksumModel's function from a KV store of its own, sized from the
// KvCache's geometry on first use (as CudaModel sizes its device cache), so a correct result
// proves the engine's block tables and slot mappings work without host storage.
class OwnKvModel final : public Model {
 public:
  OwnKvModel() {
    config_.vocab_size = ChecksumModel::kVocab;
    config_.max_position_embeddings = 256;
    config_.eos_token_ids = {ChecksumModel::kEos};
  }
  const ModelConfig& config() const override { return config_; }
  KvCacheSpec kv_cache_spec() const override { return {1, 1, 0}; }
  int64_t WeightBytesPerToken() const override { return 0; }
  absl::Status Forward(const ForwardInput& in, KvCache& kv, absl::Span<float> logits) override {
    if (kv.has_storage() || kv.k(0) != nullptr) {
      return absl::InternalError("the engine allocated a host KV cache");
    }
    const int64_t bs = kv.block_size();
    store_.resize(static_cast<size_t>(kv.num_blocks() * bs));
    for (size_t t = 0; t < in.token_ids.size(); ++t) {
      store_[static_cast<size_t>(in.slot_mapping[t])] = in.token_ids[t];
    }
    std::fill(logits.begin(), logits.end(), 0.0f);
    size_t row = 0;
    for (int32_t index : in.logits_indices) {
      for (const SequenceSlice& s : in.sequences) {
        if (index < s.query_start || index >= s.query_start + s.num_query_tokens) continue;
        const int32_t pos = in.positions[index];
        int64_t sum = 0;
        for (int32_t p = 0; p <= pos; ++p) sum += store_[s.block_table[p / bs] * bs + p % bs];
        logits[row * ChecksumModel::kVocab + ChecksumModel::Next(sum, pos)] = 10.0f;
      }
      ++row;
    }
    return absl::OkStatus();
  }

 private:
  ModelConfig config_;
  std::vector<int64_t> store_;
};

EngineOptions NoHostCacheOptions() {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 64;
  options.max_num_batched_tokens = 8;  // chunked prefill of the 11-token prompt
  options.allocate_host_kv_cache = false;
  return options;
}

TEST(DeviceKvCacheTest, KvCacheWithoutStorageHasGeometryOnly) {
  KvCache cache({2, 8, 8}, 5, 16, /*allocate_storage=*/false);
  EXPECT_FALSE(cache.has_storage());
  EXPECT_EQ(cache.k(0), nullptr);
  EXPECT_EQ(cache.v(1), nullptr);
  EXPECT_EQ(cache.num_blocks(), 5);
  EXPECT_EQ(cache.block_size(), 16);
  EXPECT_EQ(cache.BlockBytes(), 2 * 16 * 4 * 16);
  KvCache host({2, 8, 8}, 5, 16);
  EXPECT_TRUE(host.has_storage());
  EXPECT_NE(host.k(1), nullptr);
}

TEST(DeviceKvCacheTest, EngineRunsOnTheModelsOwnCache) {
  auto engine = LLMEngine::Create(std::make_unique<OwnKvModel>(), NoHostCacheOptions());
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_FALSE((*engine)->kv_cache().has_storage());
  const std::vector<std::vector<int32_t>> prompts = {{3, 9, 27, 17, 5, 8, 13, 21, 34, 55, 2},
                                                     {7, 11}};
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r;
    r.request_id = "r" + std::to_string(i);
    r.prompt_token_ids = prompts[i];
    r.sampling.max_tokens = 6;
    r.sampling.temperature = 0.0f;
    ASSERT_TRUE((*engine)->AddRequest(std::move(r)).ok());
  }
  std::vector<std::vector<int32_t>> got(prompts.size());
  for (int step = 0; step < 100 && (*engine)->HasUnfinishedRequests(); ++step) {
    for (const RequestOutput& out : (*engine)->Step()) {
      const size_t i = static_cast<size_t>(out.request_id[1] - '0');
      for (const SampledToken& t : out.new_tokens) got[i].push_back(t.token_id);
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i], ChecksumModel::Reference(prompts[i], 6)) << "request " << i;
  }
  // Nothing leaks: every block is free again (full prompt blocks stay cached, evictable).
  EXPECT_EQ((*engine)->num_free_blocks(), (*engine)->num_total_blocks());
  // Full blocks of 4 tokens: r0 holds 11 + 5 fed-back tokens (4), r1 2 + 5 (1).
  EXPECT_EQ((*engine)->num_cached_blocks(), 5);
}

TEST(DeviceKvCacheTest, CreateNeedsExplicitBlocks) {
  EngineOptions options = NoHostCacheOptions();
  options.num_kv_blocks = 0;
  auto engine = LLMEngine::Create(std::make_unique<OwnKvModel>(), options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.status().message(), "without a host KV cache num_kv_blocks must be set");
}

}  // namespace
}  // namespace sluice
