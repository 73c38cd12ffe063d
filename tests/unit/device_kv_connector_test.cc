// The KV connector (kvstore) behind a KV cache in device memory, as `--device cuda --kvstore`
// runs it, on host memory: DeviceKvModel keeps ChecksumModel's function over a cache of its own
// (4 arrays of 2-byte elements, as the CUDA runner's bf16 K/V) and moves connector blocks
// through StagedKvBlockCopier over HostMemcpyCopier, the code path CudaModel runs over
// CudaDeviceCopier. Checked: write-through of full blocks (exact bytes), loads of the prompt's
// blocks past the local cache (after the local cache was reset, too), the bf16 layout never
// mixing with a float32 host engine's, a connector refusing a second layout, a store that is
// down, a load past its deadline, failing device copies, the real kvstore service over gRPC,
// async scheduling (DeviceKvModel's simulated device queue and FencedCopier: block copies
// ordered by fences, never by waiting for the step in flight) and device copies past their
// deadline. Every run checks the tokens against ChecksumModel::Reference and that every KV
// block is free again.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
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
#include "services/kvstore/kvstore_client.h"
#include "services/kvstore/kvstore_connector.h"
#include "tests/util/fake_kv_store.h"
#include "tests/util/fake_models.h"
#include "tests/util/inprocess_kvstore.h"
#include "transfer/device_copier.h"

namespace sluice {
namespace {

using testing::ChecksumModel;
using testing::FakeKvBackend;
using testing::FakeKvStore;

constexpr int64_t kBlock = 4;
constexpr int64_t kArrays = 4;  // 2 layers, K and V
// A device block: 4 arrays x 4 tokens x 2 bytes; a host (float32) block: twice that.
constexpr int64_t kDeviceBlockBytes = kArrays * kBlock * 2;
constexpr int64_t kHostBlockBytes = kArrays * kBlock * 4;

// FencedCopier: HostMemcpyCopier's copies (run at the lane's Wait) on a simulated device: a
// lane ordered after a fence (a step number of DeviceKvModel's queue) first runs the queue
// through that step, as a CUDA copy stream waiting on the step's event would. Nothing else
// runs the queue, so a copy missing its fence sees the device as it was. While *stall is set,
// copies hang: WaitUntil sleeps to its deadline and leaves them pending (DeadlineExceeded);
// Drain (the compute stream waiting on a lane's RecordFence) still completes them.
class FencedCopier final : public transfer::DeviceCopier {
 public:
  FencedCopier(int num_lanes, std::function<void(int64_t)> run_through,
               const std::atomic<bool>* stall)
      : inner_(num_lanes),
        fences_(num_lanes, 0),
        run_through_(std::move(run_through)),
        stall_(stall) {}
  absl::Status WaitUntil(int lane, absl::Time deadline) override {
    if (stall_->load()) {
      absl::SleepFor(deadline - absl::Now());
      return absl::DeadlineExceededError("device copies still running");
    }
    return Wait(lane);
  }
  absl::StatusOr<const void*> RecordFence(int lane) override {
    if (lane < 0 || lane >= num_lanes()) return absl::InvalidArgumentError("bad lane");
    return reinterpret_cast<const void*>(static_cast<uintptr_t>(lane + 1));
  }
  // Drain completes the copies of the lane a RecordFence fence names (its step fence ran).
  void Drain(const void* fence) {
    const int lane = static_cast<int>(reinterpret_cast<uintptr_t>(fence)) - 1;
    fences_[lane] = 0;
    (void)inner_.Wait(lane);
  }
  int num_lanes() const override { return inner_.num_lanes(); }
  absl::StatusOr<void*> AllocateStaging(int64_t bytes) override {
    return inner_.AllocateStaging(bytes);
  }
  void FreeStaging(void* staging) override { inner_.FreeStaging(staging); }
  absl::Status CopyAsync(int lane, void* dst, const void* src, int64_t bytes,
                         transfer::CopyDirection direction) override {
    return inner_.CopyAsync(lane, dst, src, bytes, direction);
  }
  absl::Status WaitFence(int lane, const void* fence) override {
    if (lane < 0 || lane >= num_lanes()) return absl::InvalidArgumentError("bad lane");
    fences_[lane] = std::max(fences_[lane], static_cast<int64_t>(reinterpret_cast<uintptr_t>(fence)));
    return absl::OkStatus();
  }
  absl::Status Wait(int lane) override {
    if (lane >= 0 && lane < num_lanes() && fences_[lane] > 0) {
      run_through_(fences_[lane]);
      fences_[lane] = 0;
    }
    return inner_.Wait(lane);
  }

 private:
  transfer::HostMemcpyCopier inner_;
  std::vector<int64_t> fences_;  // per lane: the fence its pending copies follow (0: none)
  std::function<void(int64_t)> run_through_;
  const std::atomic<bool>* stall_;
};

// DeviceKvModel: ChecksumModel's next token over 2 layers of K and V, one element per token;
// array a (L0.K, L0.V, L1.K, L1.V) holds token + 17 * a. Every read checks that the four arrays
// agree, so a block scattered wrongly, partly or not at all fails the step (Internal).
// device = true: its own 2-byte arrays ("device" memory), blocks copied through a staged
// copier with slots of 3 blocks; false: the engine's float32 host KvCache.
// async = true (device only): asynchronous steps as the CUDA runner's — see DeviceQueue below.
class DeviceKvModel final : public Model {
 public:
  explicit DeviceKvModel(bool device, bool async = false) : device_(device), async_(async) {
    config_.vocab_size = ChecksumModel::kVocab;
    config_.max_position_embeddings = 256;
    config_.eos_token_ids = {ChecksumModel::kEos};
  }
  const ModelConfig& config() const override { return config_; }
  KvCacheSpec kv_cache_spec() const override { return {2, 1, 1}; }
  int64_t WeightBytesPerToken() const override { return 0; }

  absl::Status Forward(const ForwardInput& in, KvCache& kv, absl::Span<float> logits) override {
    RunThrough(num_enqueued_);  // the device runs in order: enqueued steps first
    ComputeWaits(num_enqueued_ + 1);
    std::vector<int32_t> tokens;
    if (absl::Status s = RunStep(in, kv, tokens); !s.ok()) return s;
    std::fill(logits.begin(), logits.end(), 0.0f);
    for (size_t row = 0; row < tokens.size(); ++row) {
      logits[row * ChecksumModel::kVocab + tokens[row]] = 10.0f;
    }
    return absl::OkStatus();
  }

  // ---- Asynchronous steps on a simulated device queue ----
  // DeviceQueue: an enqueued step runs only when something waits for it — its read
  // (ReadSampledStep), a synchronous Forward, or a copy lane ordered after its fence — so a
  // block copy ordered too early reads KV no step wrote yet, or is overwritten after it by a
  // step still queued, and the checksum fails. A fence is the number of the step it follows.
  bool SupportsAsyncSteps() const override { return async_; }
  absl::Status EnqueueSampledStep(const ForwardInput& input, KvCache& kv,
                                  absl::Span<const kernels::SamplingRow> rows) override {
    if (static_cast<int>(unread_.size()) >= kMaxUnreadSteps) {
      return absl::FailedPreconditionError("too many unread steps");
    }
    if (rows.size() != input.logits_indices.size()) return absl::InvalidArgumentError("rows");
    // Everything the step reads is captured now, as a runner uploads it at enqueue: block
    // tables are spans into the engine's sequences.
    QueuedStep step{input, &kv, ++num_enqueued_, {}, absl::OkStatus(), {}};
    for (SequenceSlice& s : step.input.sequences) {
      step.tables.emplace_back(s.block_table.begin(), s.block_table.end());
      s.block_table = step.tables.back();
    }
    queue_.push_back(std::move(step));
    unread_.push_back(num_enqueued_);
    max_unread = std::max(max_unread, static_cast<int>(unread_.size()));
    return absl::OkStatus();
  }
  absl::Status ReadSampledStep(absl::Span<GreedyToken> out) override {
    if (unread_.empty()) return absl::FailedPreconditionError("no step is unread");
    const int64_t step = unread_.front();
    RunThrough(step);
    const QueuedStep& done = done_.at(step);
    if (done.status.ok() && out.size() != done.tokens.size()) {
      return absl::InvalidArgumentError("out size");
    }
    unread_.pop_front();
    last_read_ = step;
    for (size_t r = 0; r < out.size() && r < done.tokens.size(); ++r) {
      out[r] = GreedyToken{done.tokens[r], 0.0f};
    }
    absl::Status status = done.status;
    done_.erase(step);
    return status;
  }
  int NumUnreadSteps() const override { return static_cast<int>(unread_.size()); }
  // RunThrough runs queued steps up to step `fence` (the device reaching that point).
  void RunThrough(int64_t fence) {
    while (!queue_.empty() && queue_.front().number <= fence) {
      QueuedStep step = std::move(queue_.front());
      queue_.pop_front();
      ComputeWaits(step.number);
      for (int32_t& t : step.input.token_ids) {  // placeholders: the previous step's tokens
        if (t < 0) t = previous_tokens_.at(static_cast<size_t>(-(t + 1)));
      }
      step.status = RunStep(step.input, *step.kv, step.tokens);
      previous_tokens_ = step.tokens;
      num_run_ = step.number;
      done_.emplace(step.number, std::move(step));
    }
  }
  int64_t num_enqueued() const { return num_enqueued_; }
  int64_t num_run() const { return num_run_; }
  int max_unread = 0;
  // Per gather / scatter: its fence and the steps enqueued when it was called.
  struct CopyCall {
    int64_t fence = 0;
    int64_t enqueued = 0;
    int64_t read = 0;  // the last step read back
  };
  std::vector<CopyCall> gather_calls, scatter_calls;

  // RunStep writes the step's K/V and returns its greedy tokens, one per logits row.
  absl::Status RunStep(const ForwardInput& in, KvCache& kv, std::vector<int32_t>& tokens) {
    if (device_) Allocate(kv);
    for (size_t t = 0; t < in.token_ids.size(); ++t) {
      for (int64_t a = 0; a < kArrays; ++a) Write(kv, a, in.slot_mapping[t], in.token_ids[t] + 17 * a);
    }
    tokens.clear();
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
      tokens.push_back(ChecksumModel::Next(sum, pos));
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
    // As CudaModel: after the last read step (the blocks the engine committed), not the tail.
    gather_calls.push_back({last_read_, num_enqueued_, last_read_});
    return copier_->Gather(*arrays, blocks, out, Fence(last_read_));
  }
  absl::Status ScatterKvBlocks(const KvCache& geometry, absl::Span<const int32_t> blocks,
                               absl::Span<const int32_t> layers,
                               absl::Span<const uint8_t> in) override {
    absl::StatusOr<std::vector<DeviceKvArray>> arrays = Prepare(geometry, layers);
    if (!arrays.ok()) return arrays.status();
    ++num_scatters;
    // As CudaModel: after every enqueued step (a step in flight may still write freed blocks).
    scatter_calls.push_back({num_enqueued_, num_enqueued_, last_read_});
    absl::Status s = copier_->Scatter(*arrays, in, blocks, Fence(num_enqueued_));
    if (absl::IsDeadlineExceeded(s)) {  // as CudaModel: later steps follow the late copies
      absl::StatusOr<std::vector<const void*>> fences = copier_->StalledFences();
      if (!fences.ok()) return fences.status();
      for (const void* f : *fences) compute_waits_.push_back({num_enqueued_ + 1, f});
      num_compute_fences += static_cast<int64_t>(fences->size());
    }
    return s;
  }

  std::atomic<bool> fail_copies{false};  // the device copies fail (Internal)
  std::atomic<bool> stall_copies{false};  // the device copies hang (FencedCopier)
  absl::Duration copy_timeout = absl::InfiniteDuration();  // set before the first copy
  int64_t num_compute_fences = 0;  // copy-lane fences later steps were ordered after
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
      options.copy_timeout = copy_timeout;
      auto fenced = std::make_unique<FencedCopier>(
          2, [this](int64_t fence) { RunThrough(fence); }, &stall_copies);
      fenced_ = fenced.get();
      auto copier = StagedKvBlockCopier::Create(std::move(fenced), options);
      if (!copier.ok()) return copier.status();
      copier_ = *std::move(copier);
    }
    return SelectKvArrays(DeviceKvArrays(), kv_cache_spec(), layers);
  }

  struct QueuedStep {
    ForwardInput input;
    KvCache* kv = nullptr;
    int64_t number = 0;
    std::vector<int32_t> tokens;
    absl::Status status;
    std::deque<std::vector<int32_t>> tables;  // owned block tables (deque: stable elements)
  };
  // ComputeWaits: before step `number` runs, the copy-lane fences it was enqueued after.
  void ComputeWaits(int64_t number) {
    while (!compute_waits_.empty() && compute_waits_.front().first <= number) {
      fenced_->Drain(compute_waits_.front().second);
      compute_waits_.pop_front();
    }
  }
  static const void* Fence(int64_t step) {
    return reinterpret_cast<const void*>(static_cast<uintptr_t>(step));
  }

  bool device_;
  bool async_;
  std::deque<QueuedStep> queue_;  // enqueued, not yet run
  std::map<int64_t, QueuedStep> done_;  // run, not yet read
  std::deque<int64_t> unread_;
  std::vector<int32_t> previous_tokens_;
  int64_t num_enqueued_ = 0, num_run_ = 0, last_read_ = 0;
  FencedCopier* fenced_ = nullptr;  // owned by copier_
  std::deque<std::pair<int64_t, const void*>> compute_waits_;  // (first step, lane fence)
  ModelConfig config_;
  std::vector<uint16_t> memory_[kArrays];
  std::unique_ptr<StagedKvBlockCopier> copier_;
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

Node MakeNodeWith(bool device, std::shared_ptr<KvConnector> connector, bool async_steps = false) {
  Node node;
  node.connector = connector;
  node.async = dynamic_cast<AsyncKvConnector*>(connector.get());
  auto model = std::make_unique<DeviceKvModel>(device, async_steps);
  node.model = model.get();
  auto engine = LLMEngine::Create(std::move(model), NodeOptions(device, connector));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (engine.ok()) node.engine = *std::move(engine);
  return node;
}

Node MakeNode(FakeKvStore* store, bool device = true,
              absl::Duration load_timeout = absl::Seconds(2), bool async_steps = false) {
  AsyncKvConnectorOptions o;
  o.failure_backoff = absl::Hours(1);  // never runs out within a test
  o.load_timeout = load_timeout;
  return MakeNodeWith(device,
                      std::make_shared<AsyncKvConnector>(std::make_unique<FakeKvBackend>(store), o),
                      async_steps);
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
  FakeKvStore store;
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
  FakeKvStore store;
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
  FakeKvStore store;
  auto connector =
      std::make_shared<AsyncKvConnector>(std::make_unique<FakeKvBackend>(&store),
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
  FakeKvStore store;
  EngineOptions options = NodeOptions(true, std::make_shared<AsyncKvConnector>(
                                                std::make_unique<FakeKvBackend>(&store),
                                                AsyncKvConnectorOptions{}));
  auto engine = LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.status().message(),
            "a KV connector without a host KV cache needs a model that copies its KV blocks to "
            "and from host memory (Model::SupportsKvBlockCopies)");
}

TEST(DeviceKvConnectorTest, StoreDownIsAMiss) {
  FakeKvStore store;
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
  FakeKvStore store;
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
  FakeKvStore store;
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

// StoredElements: the store's copy of `hash` (a plain inline client's Get), as 2-byte elements.
std::vector<uint16_t> StoredElements(const std::string& shard, const LLMEngine& engine,
                                     const BlockHash& hash) {
  kvstore::KvStoreClientOptions o;
  o.shards = {shard};
  auto client = kvstore::CreateKvStoreClient(o);
  EXPECT_TRUE(client.ok()) << client.status();
  std::vector<uint8_t> bytes(kDeviceBlockBytes);
  const BlockHasher hasher(engine.kv_identity(), kBlock);
  const kvstore::BlockKey key = kvstore::KvStoreKey(hasher, hash);
  const int32_t id = 0;
  auto got = (*client)->Get({&key, 1}, transfer::KvRegion{bytes.data(), 1, kDeviceBlockBytes},
                            {&id, 1}, absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(got.ok() && got->found[0]) << (got.ok() ? got->error : got.status());
  std::vector<uint16_t> elements(bytes.size() / 2);
  std::memcpy(elements.data(), bytes.data(), bytes.size());
  return elements;
}

// BlockElements: what block `b` of `tokens` holds in DeviceKvModel's cache, serialized.
std::vector<uint16_t> BlockElements(const std::vector<int32_t>& tokens, size_t b) {
  std::vector<uint16_t> want;
  for (int a = 0; a < kArrays; ++a) {
    for (size_t t = b * kBlock; t < (b + 1) * kBlock; ++t) {
      want.push_back(static_cast<uint16_t>(tokens[t] + 17 * a));
    }
  }
  return want;
}

struct UcxNode {
  Node node;
  kvstore::KvStoreBlockBackend* backend = nullptr;
};

UcxNode MakeUcxNode(const std::string& shard, int64_t buffer_bytes = 1 << 20) {
  // Deadlines far beyond a loaded CI machine's scheduling delays: a load that ran out of time
  // would be computed instead and the counts below would not say why.
  kvstore::KvStoreClientOptions client;
  client.shards = {shard};
  client.rpc_timeout = absl::Seconds(20);
  client.transfer_timeout = absl::Seconds(20);
  kvstore::KvStoreTransportOptions transport;
  transport.buffer_bytes = buffer_bytes;
  auto backend = kvstore::KvStoreBlockBackend::Create(client, transport);
  EXPECT_TRUE(backend.ok()) << backend.status();
  AsyncKvConnectorOptions options;
  options.load_timeout = absl::Seconds(20);
  options.save_timeout = absl::Seconds(20);
  UcxNode out;
  out.backend = backend->get();
  out.node = MakeNodeWith(true, std::make_shared<AsyncKvConnector>(*std::move(backend), options));
  return out;
}

// The kvstore's data path behind a device cache: blocks are gathered device -> pinned staging
// slots -> a buffer of the connector's UCX-registered arena, and that buffer is RMA-written into
// the store's DRAM slots (gRPC carries control only); a load RMA-reads into an arena buffer and
// scatters from it through the staging slots. Exact bytes in the store, exact tokens, every
// byte counted by the UCX agent, no inline call, every arena buffer given back.
TEST(DeviceKvConnectorTest, KvstoreBytesMoveByUcxFromTheRegisteredStagingBuffer) {
  testing::InProcessKvStore shard(16 << 20, 4 << 20, /*with_ucx=*/true);
  ASSERT_TRUE(shard.status().ok()) << shard.status();
  const std::vector<int32_t> prompt = testing::ChecksumPrompt(30, 11);
  constexpr int kMaxTokens = 5;
  UcxNode a = MakeUcxNode(shard.address());
  RunChecked(a.node, "a", prompt, kMaxTokens);
  EXPECT_EQ(a.node.engine->counters().kv_connector.num_saved_blocks, 8);
  EXPECT_GT(a.node.model->num_gathers, 0);
  EXPECT_EQ(a.node.engine->counters().num_kv_connector_copy_errors, 0);
  kvstore::KvStoreBackendStats s = a.backend->stats();
  EXPECT_FALSE(s.inline_only);
  EXPECT_GE(s.num_rma_puts, 1);
  EXPECT_EQ(s.num_inline_puts, 0);
  EXPECT_EQ(s.transfer.bytes_pushed, 8 * kDeviceBlockBytes);
  EXPECT_EQ(s.pool.num_lent, s.num_rma_puts);
  EXPECT_EQ(s.pool.num_heap_fallbacks, 0);
  EXPECT_EQ(s.pool.lent_bytes, 0);  // every buffer given back
  EXPECT_EQ(a.node.async->stats().num_rma_bytes, 8 * kDeviceBlockBytes);  // /metrics' source
  EXPECT_EQ(a.node.async->stats().num_inline_bytes, 0);
  // The store holds exactly the device cache's bytes: prompt blocks and the first output's.
  std::vector<int32_t> all = prompt;
  const std::vector<int32_t> reference = ChecksumModel::Reference(prompt, kMaxTokens);
  all.insert(all.end(), reference.begin(), reference.end() - 1);
  const BlockHasher hasher(a.node.engine->kv_identity(), kBlock);
  std::vector<BlockHash> hashes;
  hasher.ExtendFullBlockHashes(hasher.RootHash(""), all, hashes);
  ASSERT_EQ(hashes.size(), 8u);
  for (size_t b = 0; b < hashes.size(); ++b) {
    EXPECT_EQ(StoredElements(shard.address(), *a.node.engine, hashes[b]), BlockElements(all, b))
        << "block " << b;
  }

  // A second worker loads the 7 prompt blocks by one RMA read into an arena buffer, scattered
  // through the staging slots (chunks of 3 blocks).
  UcxNode b = MakeUcxNode(shard.address());
  EXPECT_EQ(RunChecked(b.node, "b", prompt, kMaxTokens).num_cached_tokens, 28);
  const EngineCounters c = b.node.engine->counters();
  EXPECT_EQ(c.num_prompt_tokens_cached_external, 28);
  EXPECT_EQ(c.num_prompt_tokens_computed, 2);
  EXPECT_EQ(c.kv_connector.num_loaded_blocks, 7);
  EXPECT_EQ(c.num_kv_connector_copy_errors, 0);
  EXPECT_EQ(b.node.model->num_scatters, 1);
  EXPECT_GE(b.node.model->copier()->stats().num_chunks, 3);
  s = b.backend->stats();
  EXPECT_EQ(s.num_rma_gets, 1);
  EXPECT_EQ(s.num_inline_gets, 0);
  EXPECT_EQ(s.transfer.bytes_pulled, 7 * kDeviceBlockBytes);
  EXPECT_EQ(s.rma_bytes, 7 * kDeviceBlockBytes);
  EXPECT_EQ(s.pool.lent_bytes, 0);
  EXPECT_EQ(b.node.model->copier()->stats().bytes_scattered, 7 * kDeviceBlockBytes);
}

// When the arena is full the engine's buffer is heap memory, which the client cannot RMA: those
// bytes ride the inline calls (counted), still exact; a store without UCX (`sluice kvstore
// --no-ucx`) answers the first RMA call FailedPrecondition and the connector goes inline for good.
TEST(DeviceKvConnectorTest, KvstoreBytesRideGrpcOnlyWhenRmaCannotMoveThem) {
  const std::vector<int32_t> prompt = testing::ChecksumPrompt(30, 12);
  {
    testing::InProcessKvStore shard(16 << 20, 4 << 20, /*with_ucx=*/true);
    ASSERT_TRUE(shard.status().ok()) << shard.status();
    UcxNode a = MakeUcxNode(shard.address(), /*buffer_bytes=*/64);  // 2 blocks
    RunChecked(a.node, "a", prompt, 5);
    EXPECT_EQ(a.node.engine->counters().kv_connector.num_saved_blocks, 8);
    const kvstore::KvStoreBackendStats s = a.backend->stats();
    EXPECT_GT(s.pool.num_heap_fallbacks, 0);
    EXPECT_EQ(s.num_inline_puts, s.pool.num_heap_fallbacks);
    EXPECT_EQ(s.num_rma_puts, s.pool.num_lent);
    EXPECT_FALSE(s.inline_only);
    const std::vector<BlockHash> hashes = PromptHashes(*a.node.engine, prompt);
    for (size_t b = 0; b < hashes.size(); ++b) {
      EXPECT_EQ(StoredElements(shard.address(), *a.node.engine, hashes[b]),
                BlockElements(prompt, b));
    }
  }
  testing::InProcessKvStore plain;  // no UCX
  ASSERT_TRUE(plain.status().ok()) << plain.status();
  UcxNode a = MakeUcxNode(plain.address());
  RunChecked(a.node, "a", prompt, 5);
  EXPECT_EQ(a.node.engine->counters().kv_connector.num_saved_blocks, 8);
  UcxNode b = MakeUcxNode(plain.address());
  EXPECT_EQ(RunChecked(b.node, "b", prompt, 5).num_cached_tokens, 28);
  for (const UcxNode* n : {&a, &b}) {
    const kvstore::KvStoreBackendStats s = n->backend->stats();
    EXPECT_TRUE(s.inline_only);
    EXPECT_EQ(s.transfer.bytes_pushed + s.transfer.bytes_pulled, 0);
  }
  EXPECT_EQ(b.backend->stats().num_inline_gets, 1);
  EXPECT_EQ(a.node.async->stats().num_inline_bytes, 8 * kDeviceBlockBytes);
  EXPECT_EQ(b.node.async->stats().num_inline_bytes, 7 * kDeviceBlockBytes);
  EXPECT_EQ(b.node.async->stats().num_rma_bytes, 0);
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

// RunAll runs greedy requests together, adding request i once `start[i]` steps have run; after
// the step that starts its connector load the loop waits for the connector, so the load lands
// at the next step while the other requests' steps are in flight. Checks every request's tokens
// and that every block is free again. Returns the final outputs by id.
std::map<std::string, RequestOutput> RunAll(Node& node,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<int>& start, int max_tokens) {
  std::map<std::string, RequestOutput> last;
  std::map<std::string, std::vector<int32_t>> tokens;
  size_t added = 0;
  for (int step = 0; step < 5000; ++step) {
    bool wait = false;
    while (added < prompts.size() && start[added] <= step) {
      const std::string id = absl::StrCat("r", added);
      EXPECT_TRUE(node.engine->AddRequest(testing::GreedyRequest(id, prompts[added], max_tokens)).ok());
      ++added;
      wait = true;
    }
    if (added == prompts.size() && !node.engine->HasUnfinishedRequests()) break;
    for (const RequestOutput& out : node.engine->Step()) {
      EXPECT_TRUE(out.status.ok()) << out.request_id << ": " << out.status;
      for (const SampledToken& t : out.new_tokens) tokens[out.request_id].push_back(t.token_id);
      if (out.finished()) last[out.request_id] = out;
    }
    if (wait || !node.engine->HasStepWork()) {
      EXPECT_TRUE(node.async->WaitIdle(absl::Now() + absl::Seconds(30)));
    }
  }
  EXPECT_FALSE(node.engine->HasUnfinishedRequests());
  EXPECT_TRUE(node.async->WaitIdle(absl::Now() + absl::Seconds(30)));  // write-through
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string id = absl::StrCat("r", i);
    EXPECT_EQ(tokens[id], ChecksumModel::Reference(prompts[i], max_tokens)) << id;
  }
  EXPECT_EQ(node.engine->num_free_blocks(), node.engine->num_total_blocks());
  return last;
}

// Async scheduling stays on with the connector: steps are enqueued one ahead of their read, the
// write-through gathers what a read step committed while the next step is still queued (its
// copies ordered after the read step, not the queue's tail), and a load's scatter lands behind
// every queued step. DeviceKvModel's queue runs a step only when something waits for it, so a
// copy ordered too early or too late stores or loads wrong K/V and the tokens go wrong.
TEST(DeviceKvConnectorTest, AsyncStepsKeepRunningAroundTheBlockCopies) {
  FakeKvStore store;
  const std::vector<int32_t> prompt = testing::ChecksumPrompt(30, 8);
  constexpr int kMaxTokens = 9;
  const std::vector<int32_t> reference = ChecksumModel::Reference(prompt, kMaxTokens);
  Node a = MakeNode(&store, true, absl::Seconds(2), /*async_steps=*/true);
  RunChecked(a, "a", prompt, kMaxTokens);
  EXPECT_EQ(a.model->max_unread, 2);  // pipelined
  EXPECT_GT(a.engine->counters().num_steps, 0);
  // Every full block computed (the last sampled token is never fed back) is stored, exactly.
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), reference.begin(), reference.end() - 1);
  const size_t full = all.size() / kBlock;
  ASSERT_EQ(store.blocks.size(), full);
  EXPECT_EQ(a.engine->counters().kv_connector.num_saved_blocks, static_cast<int64_t>(full));
  const BlockHasher hasher(a.engine->kv_identity(), kBlock);
  std::vector<BlockHash> hashes;
  hasher.ExtendFullBlockHashes(hasher.RootHash(""), all, hashes);
  ASSERT_EQ(hashes.size(), full);
  for (size_t b = 0; b < full; ++b) {
    std::vector<uint16_t> want;
    for (int a_idx = 0; a_idx < kArrays; ++a_idx) {
      for (size_t t = b * kBlock; t < (b + 1) * kBlock; ++t) {
        want.push_back(static_cast<uint16_t>(all[t] + 17 * a_idx));
      }
    }
    const std::vector<uint8_t>& bytes = store.blocks.at(hashes[b]);
    ASSERT_EQ(bytes.size(), want.size() * 2);
    std::vector<uint16_t> got(want.size());
    std::memcpy(got.data(), bytes.data(), bytes.size());
    EXPECT_EQ(got, want) << "block " << b;
  }
  // Each gather follows the last read step; some ran with the next step still queued.
  ASSERT_FALSE(a.model->gather_calls.empty());
  bool overlapped = false;
  for (const DeviceKvModel::CopyCall& c : a.model->gather_calls) {
    EXPECT_EQ(c.fence, c.read);
    overlapped = overlapped || c.enqueued > c.read;
  }
  EXPECT_TRUE(overlapped);
  EXPECT_EQ(a.engine->counters().num_kv_connector_copy_errors, 0);

  // A second worker: one request decodes while the stored prompt's load lands, so its scatter
  // comes with a step in flight and must follow it.
  Node b = MakeNode(&store, true, absl::Seconds(2), /*async_steps=*/true);
  const std::map<std::string, RequestOutput> out =
      RunAll(b, {testing::ChecksumPrompt(21, 9), prompt}, {0, 3}, kMaxTokens);
  EXPECT_EQ(out.at("r1").num_cached_tokens, 28);
  const EngineCounters c = b.engine->counters();
  EXPECT_EQ(c.num_prompt_tokens_cached_external, 28);
  EXPECT_EQ(c.kv_connector.num_loaded_blocks, 7);
  EXPECT_EQ(c.num_kv_connector_copy_errors, 0);
  ASSERT_EQ(b.model->scatter_calls.size(), 1u);
  EXPECT_EQ(b.model->scatter_calls[0].fence, b.model->scatter_calls[0].enqueued);
  EXPECT_GT(b.model->scatter_calls[0].enqueued, b.model->scatter_calls[0].read);  // in flight
  EXPECT_EQ(b.model->max_unread, 2);
}

// Device copies that outlive their deadline (the store call's, StagedKvBlocksOptions::
// copy_timeout) are errors: the save is dropped, the load computed, the tokens unchanged and
// every block freed; the late copies of a failed scatter are waited for by the steps after it
// (they may still write the freed blocks), and the copier works again once the device does.
TEST(DeviceKvConnectorTest, DeviceCopiesPastTheirDeadlineDropTheSaveAndComputeTheLoad) {
  FakeKvStore store;
  const std::vector<int32_t> prompt = testing::ChecksumPrompt(30, 10);
  Node a = MakeNode(&store, true, absl::Seconds(2), /*async_steps=*/true);
  a.model->copy_timeout = absl::Milliseconds(30);
  a.model->stall_copies = true;
  RunChecked(a, "a", prompt, 3);
  EXPECT_TRUE(store.blocks.empty());
  EXPECT_GT(a.engine->counters().num_kv_connector_copy_errors, 0);
  ASSERT_NE(a.model->copier(), nullptr);
  EXPECT_GT(a.model->copier()->stats().num_deadline_exceeded, 0);
  EXPECT_EQ(a.model->num_compute_fences, 0);  // gathers only: nothing a step must wait for
  a.model->stall_copies = false;
  a.engine->ResetPrefixCache();
  RunChecked(a, "a2", prompt, 3);
  ASSERT_EQ(store.blocks.size(), 8u);

  Node b = MakeNode(&store, true, absl::Seconds(2), /*async_steps=*/true);
  b.model->copy_timeout = absl::Milliseconds(30);
  b.model->stall_copies = true;
  EXPECT_EQ(RunChecked(b, "b", prompt, 3).num_cached_tokens, 0);
  EngineCounters c = b.engine->counters();
  EXPECT_EQ(c.kv_connector.num_loaded_blocks, 7);     // fetched ...
  EXPECT_EQ(c.num_prompt_tokens_cached_external, 0);  // ... but computed
  EXPECT_EQ(c.num_prompt_tokens_computed, 30);
  EXPECT_GE(c.num_kv_connector_copy_errors, 1);
  EXPECT_EQ(b.model->num_compute_fences, 2);  // both lanes had copies of the failed scatter
  b.model->stall_copies = false;
  b.engine->ResetPrefixCache();
  EXPECT_EQ(RunChecked(b, "b2", prompt, 3).num_cached_tokens, 28);
  EXPECT_EQ(b.engine->counters().num_prompt_tokens_cached_external, 28);
}

}  // namespace
}  // namespace sluice
