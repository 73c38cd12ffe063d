// The KV connector (kvstore) behind a KV cache in device memory, as `--device cuda --kvstore`
// runs it, on host memory: DeviceKvModel keeps ChecksumModel's function over a cache of its own
// (4 arrays of 2-byte elements, as the CUDA runner's bf16 K/V) and moves connector blocks
// through StagedKvBlockCopier over HostMemcpyCopier, the code path CudaModel runs over
// CudaDeviceCopier. Checked: write-through of full blocks (exact bytes), loads of the prompt's
// blocks past the local cache (after the local cache was reset, too), the bf16 layout never
// mixing with a float32 host engine's, a connector refusing a second layout, a store that is
// down, a load past its deadline, failing device copies, and the real kvstore service over
// gRPC. Every run checks the tokens against ChecksumModel::Reference and that every KV block
// is free again.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "engine/kv/kv_connector.h"
#include "engine/kv/staged_kv_blocks.h"
#include "engine/sched/llm_engine.h"
#include "services/kvstore/kvstore_connector.h"
#include "tests/util/fake_models.h"
#include "tests/util/inprocess_kvstore.h"
#include "transfer/device_copier.h"

namespace sluice {
namespace {

using testing::ChecksumModel;

constexpr int64_t kBlock = 4;
constexpr int64_t kArrays = 4;  // 2 layers, K and V
// A device block: 4 arrays x 4 tokens x 2 bytes; a host (float32) block: twice that.
constexpr int64_t kDeviceBlockBytes = kArrays * kBlock * 2;
constexpr int64_t kHostBlockBytes = kArrays * kBlock * 4;

// DeviceKvModel: ChecksumModel's next token over 2 layers of K and V, one element per token;
// array a (L0.K, L0.V, L1.K, L1.V) holds token + 17 * a. Every read checks that the four arrays
// agree, so a block scattered wrongly, partly or not at all fails the step (Internal).
// device = true: its own 2-byte arrays ("device" memory), blocks copied through a staged
// copier with slots of 3 blocks; false: the engine's float32 host KvCache.
class DeviceKvModel final : public Model {
 public:
  explicit DeviceKvModel(bool device) : device_(device) {
    config_.vocab_size = ChecksumModel::kVocab;
    config_.max_position_embeddings = 256;
    config_.eos_token_ids = {ChecksumModel::kEos};
  }
  const ModelConfig& config() const override { return config_; }
  KvCacheSpec kv_cache_spec() const override { return {2, 1, 1}; }
  int64_t WeightBytesPerToken() const override { return 0; }

  absl::Status Forward(const ForwardInput& in, KvCache& kv, absl::Span<float> logits) override {
    if (device_) Allocate(kv);
    for (size_t t = 0; t < in.token_ids.size(); ++t) {
      for (int64_t a = 0; a < kArrays; ++a) Write(kv, a, in.slot_mapping[t], in.token_ids[t] + 17 * a);
    }
    std::fill(logits.begin(), logits.end(), 0.0f);
    size_t row = 0;
    for (int32_t index : in.logits_indices) {
      const SequenceSlice* seq = nullptr;
      for (const SequenceSlice& s : in.sequences) {
        if (index >= s.query_start && index < s.query_start + s.num_query_tokens) seq = &s;
      }
      if (seq == nullptr) return absl::InternalError("logits index outside every sequence");
      const int32_t pos = in.positions[index];
      int64_t sum = 0;
      for (int32_t p = 0; p <= pos; ++p) {
        const int64_t slot = seq->block_table[p / kBlock] * kBlock + p % kBlock;
        const int64_t token = Read(kv, 0, slot);
        for (int64_t a = 1; a < kArrays; ++a) {
          if (Read(kv, a, slot) != token + 17 * a) {
            return absl::InternalError(absl::StrCat("KV arrays disagree at slot ", slot));
          }
        }
        sum += token;
      }
      logits[row * ChecksumModel::kVocab + ChecksumModel::Next(sum, pos)] = 10.0f;
      ++row;
    }
    return absl::OkStatus();
  }

  std::vector<DeviceKvArray> DeviceKvArrays() const override {
    std::vector<DeviceKvArray> arrays;
    if (!device_ || memory_[0].empty()) return arrays;
    for (const auto& m : memory_) {
      arrays.push_back({const_cast<uint16_t*>(m.data()),
                        static_cast<int64_t>(m.size()) / kBlock, kBlock * 2});
    }
    return arrays;
  }
  int64_t KvDtypeBytes() const override { return device_ ? 2 : 4; }
  bool SupportsKvBlockCopies() const override { return device_; }
  absl::Status GatherKvBlocks(const KvCache& geometry, absl::Span<const int32_t> blocks,
                              absl::Span<const int32_t> layers,
                              absl::Span<uint8_t> out) override {
    absl::StatusOr<std::vector<DeviceKvArray>> arrays = Prepare(geometry, layers);
    if (!arrays.ok()) return arrays.status();
    ++num_gathers;
    return copier_->Gather(*arrays, blocks, out);
  }
  absl::Status ScatterKvBlocks(const KvCache& geometry, absl::Span<const int32_t> blocks,
                               absl::Span<const int32_t> layers,
                               absl::Span<const uint8_t> in) override {
    absl::StatusOr<std::vector<DeviceKvArray>> arrays = Prepare(geometry, layers);
    if (!arrays.ok()) return arrays.status();
    ++num_scatters;
    return copier_->Scatter(*arrays, in, blocks);
  }

  std::atomic<bool> fail_copies{false};  // the device copies fail (Internal)
  int64_t num_gathers = 0, num_scatters = 0;
  const StagedKvBlockCopier* copier() const { return copier_.get(); }

 private:
  void Allocate(const KvCache& kv) {
    const size_t n = static_cast<size_t>(kv.num_blocks() * kBlock);
    if (memory_[0].size() == n) return;
    for (auto& m : memory_) m.assign(n, 0);
  }
  void Write(KvCache& kv, int64_t a, int64_t slot, int64_t value) {
    if (device_) {
      memory_[a][static_cast<size_t>(slot)] = static_cast<uint16_t>(value);
    } else {
      (a % 2 == 0 ? kv.k(a / 2) : kv.v(a / 2))[slot] = static_cast<float>(value);
    }
  }
  int64_t Read(KvCache& kv, int64_t a, int64_t slot) const {
    if (device_) return memory_[a][static_cast<size_t>(slot)];
    return static_cast<int64_t>((a % 2 == 0 ? kv.k(a / 2) : kv.v(a / 2))[slot]);
  }
  absl::StatusOr<std::vector<DeviceKvArray>> Prepare(const KvCache& geometry,
                                                     absl::Span<const int32_t> layers) {
    if (fail_copies) return absl::InternalError("cudaMemcpyAsync: unspecified launch failure");
    Allocate(geometry);
    if (copier_ == nullptr) {
      StagedKvBlocksOptions options;
      options.slot_bytes = 3 * kDeviceBlockBytes;
      auto copier = StagedKvBlockCopier::Create(
          std::make_unique<transfer::HostMemcpyCopier>(2), options);
      if (!copier.ok()) return copier.status();
      copier_ = *std::move(copier);
    }
    return SelectKvArrays(DeviceKvArrays(), kv_cache_spec(), layers);
  }

  bool device_;
  ModelConfig config_;
  std::vector<uint16_t> memory_[kArrays];
  std::unique_ptr<StagedKvBlockCopier> copier_;
};

// FakeStore: blocks by hash (their bytes kept), shared by several connectors' backends.
struct FakeStore {
  std::mutex mu;
  absl::flat_hash_map<BlockHash, std::vector<uint8_t>> blocks;
  bool down = false;
  bool stall_gets = false;  // Get waits out its deadline and answers DeadlineExceeded
};

class FakeBackend final : public KvBlockStoreBackend {
 public:
  explicit FakeBackend(FakeStore* store) : store_(store) {}
  absl::Status Bind(const KvConnectorLayout& layout) override {
    block_bytes_ = static_cast<size_t>(layout.block_bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<bool>> Exists(absl::Span<const BlockHash> hashes,
                                           absl::Time) override {
    std::lock_guard<std::mutex> lock(store_->mu);
    if (store_->down) return absl::UnavailableError("kvstore down");
    std::vector<bool> found;
    for (const BlockHash& h : hashes) found.push_back(store_->blocks.contains(h));
    return found;
  }
  absl::StatusOr<std::vector<bool>> Get(absl::Span<const BlockHash> hashes,
                                        absl::Span<uint8_t> out, absl::Time deadline) override {
    bool stall = false;
    {
      std::lock_guard<std::mutex> lock(store_->mu);
      stall = store_->stall_gets;
    }
    if (stall) {
      absl::SleepFor(deadline - absl::Now());
      return absl::DeadlineExceededError("kvstore get: deadline exceeded");
    }
    std::lock_guard<std::mutex> lock(store_->mu);
    if (store_->down) return absl::UnavailableError("kvstore down");
    std::vector<bool> found;
    for (size_t i = 0; i < hashes.size(); ++i) {
      auto it = store_->blocks.find(hashes[i]);
      const bool ok = it != store_->blocks.end() && it->second.size() == block_bytes_;
      if (ok) std::memcpy(out.data() + i * block_bytes_, it->second.data(), block_bytes_);
      found.push_back(ok);
    }
    return found;
  }
  absl::StatusOr<PutCounts> Put(absl::Span<const BlockHash> hashes,
                                absl::Span<const uint8_t> bytes, absl::Time) override {
    std::lock_guard<std::mutex> lock(store_->mu);
    if (store_->down) return absl::UnavailableError("kvstore down");
    PutCounts counts;
    for (size_t i = 0; i < hashes.size(); ++i) {
      auto [it, inserted] = store_->blocks.try_emplace(hashes[i]);
      if (!inserted) {
        ++counts.present;
        continue;
      }
      it->second.assign(bytes.begin() + i * block_bytes_, bytes.begin() + (i + 1) * block_bytes_);
      ++counts.stored;
    }
    return counts;
  }

 private:
  FakeStore* store_;
  size_t block_bytes_ = 0;
};

struct Node {
  std::shared_ptr<KvConnector> connector;
  AsyncKvConnector* async = nullptr;
  DeviceKvModel* model = nullptr;
  std::unique_ptr<LLMEngine> engine;
};

EngineOptions NodeOptions(bool device, std::shared_ptr<KvConnector> connector) {
  EngineOptions options;
  options.block_size = kBlock;
  options.num_kv_blocks = 64;
  options.max_model_len = 64;
  options.max_num_batched_tokens = 16;
  options.model_id = "device-kv";
  options.allocate_host_kv_cache = !device;
  options.kv_connector = std::move(connector);
  return options;
}

Node MakeNodeWith(bool device, std::shared_ptr<KvConnector> connector) {
  Node node;
  node.connector = connector;
  node.async = dynamic_cast<AsyncKvConnector*>(connector.get());
  auto model = std::make_unique<DeviceKvModel>(device);
  node.model = model.get();
  auto engine = LLMEngine::Create(std::move(model), NodeOptions(device, connector));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (engine.ok()) node.engine = *std::move(engine);
  return node;
}

Node MakeNode(FakeStore* store, bool device = true,
              absl::Duration load_timeout = absl::Seconds(2)) {
  AsyncKvConnectorOptions o;
  o.failure_backoff = absl::Hours(1);  // never runs out within a test
  o.load_timeout = load_timeout;
  return MakeNodeWith(device,
                      std::make_shared<AsyncKvConnector>(std::make_unique<FakeBackend>(store), o));
}

// RunChecked runs one greedy request to the end (connector work finishes between steps, so the
// test never depends on timing) and checks its tokens and that every block is free again.
RequestOutput RunChecked(Node& node, const std::string& id, const std::vector<int32_t>& prompt,
                         int max_tokens) {
  RequestOutput last;
  EXPECT_TRUE(node.engine->AddRequest(testing::GreedyRequest(id, prompt, max_tokens)).ok());
  std::vector<int32_t> tokens;
  for (int i = 0; i < 1000 && node.engine->HasUnfinishedRequests(); ++i) {
    EXPECT_TRUE(node.async->WaitIdle(absl::Now() + absl::Seconds(30)));
    for (const RequestOutput& out : node.engine->Step()) {
      EXPECT_TRUE(out.status.ok()) << out.status;
      for (const SampledToken& t : out.new_tokens) tokens.push_back(t.token_id);
      if (out.finished()) last = out;
    }
  }
  EXPECT_FALSE(node.engine->HasUnfinishedRequests());
  EXPECT_TRUE(node.async->WaitIdle(absl::Now() + absl::Seconds(30)));  // write-through
  EXPECT_EQ(tokens, ChecksumModel::Reference(prompt, max_tokens)) << id;
  EXPECT_EQ(node.engine->num_free_blocks(), node.engine->num_total_blocks()) << id;
  return last;
}

std::vector<BlockHash> PromptHashes(const LLMEngine& engine, const std::vector<int32_t>& prompt) {
  const BlockHasher hasher(engine.kv_identity(), kBlock);
  std::vector<BlockHash> hashes;
  hasher.ExtendFullBlockHashes(hasher.RootHash(""), prompt, hashes);
  return hashes;
}

TEST(DeviceKvConnectorTest, WritesThroughAndLoadsThroughTheDeviceCache) {
  FakeStore store;
  const std::vector<int32_t> prompt = testing::ChecksumPrompt(30, 1);
  Node a = MakeNode(&store);
  EXPECT_EQ(RunChecked(a, "a", prompt, 5).num_cached_tokens, 0);
  // 30 prompt + 4 fed-back tokens computed: 8 full blocks, gathered from the device cache.
  ASSERT_EQ(store.blocks.size(), 8u);
  EXPECT_EQ(a.engine->counters().kv_connector.num_saved_blocks, 8);
  EXPECT_GT(a.model->num_gathers, 0);
  // Block 1 (tokens 4..7) as stored: per layer K then V, 2-byte elements in token order.
  const std::vector<BlockHash> hashes = PromptHashes(*a.engine, prompt);
  const std::vector<uint8_t>& bytes = store.blocks.at(hashes[1]);
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), kDeviceBlockBytes);
  std::vector<uint16_t> elements(bytes.size() / 2);
  std::memcpy(elements.data(), bytes.data(), bytes.size());
  std::vector<uint16_t> want;
  for (int a_idx = 0; a_idx < kArrays; ++a_idx) {
    for (int t = 4; t < 8; ++t) want.push_back(static_cast<uint16_t>(prompt[t] + 17 * a_idx));
  }
  EXPECT_EQ(elements, want);

  // A second worker loads the 7 prompt blocks past its (empty) local cache: 7 blocks in chunks
  // of 3 through the staging slots.
  Node b = MakeNode(&store);
  EXPECT_EQ(RunChecked(b, "b", prompt, 5).num_cached_tokens, 28);
  EngineCounters c = b.engine->counters();
  EXPECT_EQ(c.num_prompt_tokens_computed, 2);
  EXPECT_EQ(c.num_prompt_tokens_cached_external, 28);
  EXPECT_EQ(c.kv_connector.num_loaded_blocks, 7);
  EXPECT_EQ(c.kv_connector.num_saved_blocks, 0);  // all in the store already
  EXPECT_EQ(c.num_kv_connector_copy_errors, 0);
  EXPECT_EQ(b.model->num_scatters, 1);
  EXPECT_GE(b.model->copier()->stats().num_chunks, 3);
  // The local GPU cache forgets its blocks: the next pass loads them from the store again.
  b.engine->ResetPrefixCache();
  EXPECT_EQ(RunChecked(b, "b2", prompt, 5).num_cached_tokens, 28);
  c = b.engine->counters();
  EXPECT_EQ(c.num_prompt_tokens_cached_external, 56);
  EXPECT_EQ(c.kv_connector.num_loaded_blocks, 14);
  // And without the reset the local cache serves it, with no load.
  EXPECT_EQ(RunChecked(b, "b3", prompt, 5).num_cached_tokens, 28);
  EXPECT_EQ(b.engine->counters().num_prompt_tokens_cached_external, 56);
}

TEST(DeviceKvConnectorTest, Bf16DeviceBlocksNeverMixWithFloat32HostBlocks) {
  FakeStore store;
  const std::vector<int32_t> prompt = testing::ChecksumPrompt(30, 2);
  Node device = MakeNode(&store, true);
  Node host = MakeNode(&store, false);
  EXPECT_NE(device.engine->kv_identity().find(";dtype=bf16;"), std::string::npos)
      << device.engine->kv_identity();
  EXPECT_NE(host.engine->kv_identity().find(";dtype=f32;"), std::string::npos);
  RunChecked(device, "d", prompt, 3);
  ASSERT_EQ(store.blocks.size(), 8u);  // 30 + 2 tokens computed
  // Same model, same tokens, another layout: the host worker finds nothing and stores its own.
  EXPECT_EQ(RunChecked(host, "h", prompt, 3).num_cached_tokens, 0);
  EXPECT_EQ(host.engine->counters().kv_connector.num_loaded_blocks, 0);
  ASSERT_EQ(store.blocks.size(), 16u);
  for (const BlockHash& h : PromptHashes(*host.engine, prompt)) {
    EXPECT_EQ(static_cast<int64_t>(store.blocks.at(h).size()), kHostBlockBytes);
  }
  for (const BlockHash& h : PromptHashes(*device.engine, prompt)) {
    EXPECT_EQ(static_cast<int64_t>(store.blocks.at(h).size()), kDeviceBlockBytes);
  }
  // Each layout still loads its own.
  Node host2 = MakeNode(&store, false);
  EXPECT_EQ(RunChecked(host2, "h2", prompt, 3).num_cached_tokens, 28);
  Node device2 = MakeNode(&store, true);
  EXPECT_EQ(RunChecked(device2, "d2", prompt, 3).num_cached_tokens, 28);
}

TEST(DeviceKvConnectorTest, AConnectorServesOneLayout) {
  FakeStore store;
  auto connector =
      std::make_shared<AsyncKvConnector>(std::make_unique<FakeBackend>(&store),
                                         AsyncKvConnectorOptions{});
  Node device = MakeNodeWith(true, connector);
  ASSERT_NE(device.engine, nullptr);
  // A second engine of the same layout may share it.
  Node same = MakeNodeWith(true, connector);
  EXPECT_NE(same.engine, nullptr);
  auto host = LLMEngine::Create(std::make_unique<DeviceKvModel>(false),
                                NodeOptions(false, connector));
  ASSERT_FALSE(host.ok());
  EXPECT_EQ(host.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string bf16 = device.engine->kv_identity();
  const std::string f32 = absl::StrReplaceAll(bf16, {{";dtype=bf16;", ";dtype=f32;"}});
  EXPECT_EQ(host.status().message(),
            absl::StrCat("KV connector is bound to layout '", bf16, "' (32 bytes per block of 4 "
                         "tokens); this engine's is '", f32, "' (64 bytes per block of 4 tokens)"));
}

TEST(DeviceKvConnectorTest, WithoutBlockCopiesADeviceCacheTakesNoConnector) {
  FakeStore store;
  EngineOptions options = NodeOptions(true, std::make_shared<AsyncKvConnector>(
                                                std::make_unique<FakeBackend>(&store),
                                                AsyncKvConnectorOptions{}));
  auto engine = LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.status().message(),
            "a KV connector without a host KV cache needs a model that copies its KV blocks to "
            "and from host memory (Model::SupportsKvBlockCopies)");
}

TEST(DeviceKvConnectorTest, StoreDownIsAMiss) {
  FakeStore store;
  store.down = true;
  Node b = MakeNode(&store);
  EXPECT_EQ(RunChecked(b, "b", testing::ChecksumPrompt(30, 3), 3).num_cached_tokens, 0);
  const EngineCounters c = b.engine->counters();
  EXPECT_EQ(c.num_prompt_tokens_computed, 30);
  EXPECT_EQ(c.kv_connector.num_load_errors, 1);
  EXPECT_EQ(c.kv_connector.num_save_failed_blocks, 8);
  EXPECT_EQ(c.num_kv_connector_copy_errors, 0);
}

TEST(DeviceKvConnectorTest, ALoadPastItsDeadlineIsComputed) {
  FakeStore store;
  const std::vector<int32_t> prompt = testing::ChecksumPrompt(30, 4);
  {
    Node a = MakeNode(&store);
    RunChecked(a, "a", prompt, 3);
  }
  store.stall_gets = true;
  Node b = MakeNode(&store, true, absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  EXPECT_EQ(RunChecked(b, "b", prompt, 3).num_cached_tokens, 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  const EngineCounters c = b.engine->counters();
  EXPECT_EQ(c.num_prompt_tokens_computed, 30);
  EXPECT_EQ(c.kv_connector.num_load_errors, 1);
  EXPECT_EQ(c.kv_connector.num_loaded_blocks, 0);
  EXPECT_EQ(b.model->num_scatters, 0);
}

TEST(DeviceKvConnectorTest, FailedDeviceCopiesComputeTheBlocksAndDropTheSaves) {
  FakeStore store;
  const std::vector<int32_t> prompt = testing::ChecksumPrompt(30, 5);
  Node a = MakeNode(&store);
  a.model->fail_copies = true;
  RunChecked(a, "a", prompt, 3);
  EXPECT_TRUE(store.blocks.empty());
  EXPECT_GT(a.engine->counters().num_kv_connector_copy_errors, 0);
  a.model->fail_copies = false;
  a.engine->ResetPrefixCache();
  RunChecked(a, "a2", prompt, 3);
  ASSERT_EQ(store.blocks.size(), 8u);

  // The load finds the blocks, the scatter fails: the request computes them, nothing leaks.
  Node b = MakeNode(&store);
  b.model->fail_copies = true;
  EXPECT_EQ(RunChecked(b, "b", prompt, 3).num_cached_tokens, 0);
  EngineCounters c = b.engine->counters();
  EXPECT_EQ(c.kv_connector.num_loaded_blocks, 7);  // fetched ...
  EXPECT_EQ(c.num_prompt_tokens_cached_external, 0);  // ... but never counted
  EXPECT_EQ(c.num_prompt_tokens_computed, 30);
  EXPECT_GE(c.num_kv_connector_copy_errors, 1);
  // The blocks were not registered half filled: a healthy copy later loads them again.
  b.model->fail_copies = false;
  b.engine->ResetPrefixCache();
  EXPECT_EQ(RunChecked(b, "b2", prompt, 3).num_cached_tokens, 28);
}

// The real kvstore: one in-process shard over gRPC, as `sluice serve --device cuda --kvstore`.
TEST(DeviceKvConnectorTest, ThroughTheKvstoreService) {
  testing::InProcessKvStore shard;
  ASSERT_TRUE(shard.status().ok()) << shard.status();
  auto connect = [&] {
    auto c = kvstore::CreateKvStoreConnector({shard.address()});
    EXPECT_TRUE(c.ok()) << c.status();
    return *std::move(c);
  };
  const std::vector<int32_t> prompt = testing::ChecksumPrompt(30, 6);
  Node a = MakeNodeWith(true, connect());
  RunChecked(a, "a", prompt, 5);
  EXPECT_EQ(a.engine->counters().kv_connector.num_saved_blocks, 8);
  Node b = MakeNodeWith(true, connect());
  EXPECT_EQ(RunChecked(b, "b", prompt, 5).num_cached_tokens, 28);
  EXPECT_EQ(b.engine->counters().num_prompt_tokens_cached_external, 28);
  b.engine->ResetPrefixCache();
  EXPECT_EQ(RunChecked(b, "b2", prompt, 5).num_cached_tokens, 28);
  // A float32 host worker of the same model shares the store but not the layout.
  Node host = MakeNodeWith(false, connect());
  EXPECT_EQ(RunChecked(host, "h", prompt, 5).num_cached_tokens, 0);
  EXPECT_EQ(host.engine->counters().kv_connector.num_saved_blocks, 8);
}

TEST(DeviceKvConnectorTest, AnUnreachableKvstoreIsAMiss) {
  // Nothing listens on port 1: UNAVAILABLE, within the deadline; the request is computed.
  AsyncKvConnectorOptions o;
  o.load_timeout = absl::Milliseconds(500);
  o.save_timeout = absl::Milliseconds(500);
  auto c = kvstore::CreateKvStoreConnector({"127.0.0.1:1"}, o);
  ASSERT_TRUE(c.ok()) << c.status();
  Node b = MakeNodeWith(true, *std::move(c));
  EXPECT_EQ(RunChecked(b, "b", testing::ChecksumPrompt(30, 7), 3).num_cached_tokens, 0);
  const EngineCounters counters = b.engine->counters();
  EXPECT_EQ(counters.num_prompt_tokens_computed, 30);
  EXPECT_EQ(counters.kv_connector.num_load_errors, 1);
  EXPECT_EQ(counters.kv_connector.num_saved_blocks, 0);
}

}  // namespace
}  // namespace sluice
