// Layer-by-layer push (disaggregated prefill, push mode "layerwise") from KV the transport cannot
// reach, through pinned staging: the prefill engine's KV cache stands in for device memory (it is
// not registered with the prefill worker's UCX agent), each layer's K/V is copied into staging
// slots registered with the agent (StagedKvTransfer over HostMemcpyCopier, the code path a GPU
// worker runs over CudaDeviceCopier) and RMA-written into the decode engine's reserved blocks as
// the forward of the last prompt chunk completes the layer (LayerwisePush fed by the engine's
// KvLayerObserver). Checked: every layer's K/V lands exactly (byte for byte, in the reserved
// blocks), the decode engine continues with the tokens a single engine gives, the chunk and byte
// counts of the staging, and every block is free again on both sides.
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "engine/kv/kv_block_allocator.h"
#include "engine/model/dummy_weights.h"
#include "engine/sched/llm_engine.h"
#include "services/common/task_pool.h"
#include "services/common/worker_wire.h"
#include "tests/util/test_paths.h"
#include "transfer/block_runs.h"
#include "transfer/device_copier.h"
#include "transfer/kv_transfer.h"
#include "transfer/layerwise_push.h"
#include "transfer/staged_transfer.h"

namespace sluice {
namespace {

constexpr int64_t kBlockSize = 4;
constexpr int kPromptLen = 37;  // three chunks of 16: only the last one reports layers
constexpr int kMaxTokens = 8;

std::unique_ptr<LLMEngine> MakeEngine() {
  auto model = LoadDummyModel(testing::FixtureDir("llama-tiny"), 3);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  EngineOptions options;
  options.block_size = kBlockSize;
  options.num_kv_blocks = 64;
  options.max_model_len = 128;
  options.max_num_batched_tokens = 16;
  auto engine = LLMEngine::Create(*std::move(model), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

EngineRequest Greedy(const std::string& id, int vocab) {
  EngineRequest r;
  r.request_id = id;
  for (int i = 0; i < kPromptLen; ++i) r.prompt_token_ids.push_back(3 + (i * 7 + 5) % (vocab - 3));
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = kMaxTokens;
  return r;
}

// Feeds the engine's per-layer reports into the push (as the prefill worker's observer does).
class PushObserver final : public KvLayerObserver {
 public:
  explicit PushObserver(std::shared_ptr<transfer::LayerwisePush> push) : push_(std::move(push)) {}
  void OnPromptBlocks(absl::Span<const int32_t> block_ids) override {
    blocks.assign(block_ids.begin(), block_ids.end());
    EXPECT_TRUE(push_->Start(block_ids).ok());
  }
  void OnLayerReady(int32_t layer, std::function<absl::Status()> wait) override {
    ++layers_reported;
    push_->LayerReady(layer, std::move(wait));
  }
  std::vector<int32_t> blocks;
  int layers_reported = 0;

 private:
  std::shared_ptr<transfer::LayerwisePush> push_;
};

// The bytes of `region`'s blocks `ids`, in order.
std::vector<uint8_t> BlockBytes(const transfer::KvRegion& region, const std::vector<int32_t>& ids) {
  std::vector<uint8_t> out;
  const uint8_t* base = static_cast<const uint8_t*>(region.base);
  for (int32_t b : ids) {
    out.insert(out.end(), base + b * region.block_bytes, base + (b + 1) * region.block_bytes);
  }
  return out;
}

TEST(StagedLayerwisePushTest, EveryLayerLandsThroughStagingAndDecodeContinuesExactly) {
  std::unique_ptr<LLMEngine> prefill = MakeEngine(), decode = MakeEngine(), single = MakeEngine();
  ASSERT_TRUE(prefill && decode && single);
  const int vocab = static_cast<int>(prefill->model().config().vocab_size);
  const int64_t num_layers = prefill->kv_cache().spec().num_layers;
  const int64_t free_prefill = prefill->num_free_blocks(), free_decode = decode->num_free_blocks();

  // The reference: one engine, prompt and decode.
  ASSERT_TRUE(single->AddRequest(Greedy("r", vocab)).ok());
  std::vector<int32_t> reference;
  for (int i = 0; i < 200 && single->HasUnfinishedRequests(); ++i) {
    for (const RequestOutput& out : single->Step()) {
      for (const SampledToken& t : out.new_tokens) reference.push_back(t.token_id);
    }
  }
  ASSERT_EQ(reference.size(), static_cast<size_t>(kMaxTokens));

  // Decode: its KV registered with its agent (the peer's memory the transport reaches).
  transfer::KvTransferOptions transport;
  transport.transports = "tcp";
  auto decode_agent = transfer::KvTransferAgent::Create(transport);
  auto prefill_agent = transfer::KvTransferAgent::Create(transport);
  ASSERT_TRUE(decode_agent.ok() && prefill_agent.ok());
  const std::vector<transfer::KvRegion> decode_regions = KvRegionsOf(decode->kv_cache());
  for (const transfer::KvRegion& r : decode_regions) {
    ASSERT_TRUE((*decode_agent)->RegisterRegion(r.base, r.num_blocks * r.block_bytes).ok());
  }
  auto descriptor = (*decode_agent)->Describe(decode_regions);
  ASSERT_TRUE(descriptor.ok()) << descriptor.status();
  auto reserved = decode->ReserveForTransfer(Greedy("r", vocab), std::nullopt);
  ASSERT_TRUE(reserved.ok()) << reserved.status();

  // Prefill: its KV is "device" memory — not registered; staging slots of 3 blocks of one
  // region, so a layer's 10 prompt blocks take 4 chunks per region.
  const std::vector<transfer::KvRegion> prefill_regions = KvRegionsOf(prefill->kv_cache());
  const int64_t region_block_bytes = prefill_regions[0].block_bytes;
  transfer::HostMemcpyCopier copier(2);
  auto staged = transfer::StagedKvTransfer::Create(
      prefill_agent->get(), &copier, transfer::StagingOptions{3 * region_block_bytes, 2});
  ASSERT_TRUE(staged.ok()) << staged.status();
  std::vector<int32_t> region_layers;
  for (size_t i = 0; i < prefill_regions.size(); ++i) region_layers.push_back(static_cast<int32_t>(i / 2));
  TaskPool pool(2);
  transfer::LayerwisePush::Options options;
  options.num_layers = static_cast<int32_t>(num_layers);
  options.deadline = absl::Now() + absl::Seconds(30);
  transfer::StagedKvTransfer* staging = staged->get();
  auto push = transfer::LayerwisePush::Create(
      [staging](const transfer::RemoteKvDescriptor& remote,
                absl::Span<const transfer::BlockRun> remote_runs,
                absl::Span<const transfer::KvRegion> local,
                absl::Span<const transfer::BlockRun> local_runs, absl::Time deadline) {
        return staging->Push(remote, remote_runs, local, local_runs, deadline);
      },
      [&pool](std::function<void()> job) { pool.Post(std::move(job)); }, *descriptor,
      transfer::CoalesceBlocks(*reserved), prefill_regions, region_layers, options);
  ASSERT_TRUE(push.ok()) << push.status();
  std::promise<absl::Status> done;
  (*push)->OnDone([&done](absl::Status s) { done.set_value(std::move(s)); });
  auto observer = std::make_shared<PushObserver>(*push);

  EngineRequest held = Greedy("r", vocab);
  held.hold_kv_blocks = true;
  held.kv_layer_observer = observer;
  ASSERT_TRUE(prefill->AddRequest(std::move(held)).ok());
  std::optional<SampledToken> first;
  std::vector<int32_t> held_blocks;
  for (int i = 0; i < 100 && !first.has_value(); ++i) {
    for (const RequestOutput& out : prefill->Step()) {
      ASSERT_TRUE(out.status.ok()) << out.status;
      if (!out.new_tokens.empty()) first = out.new_tokens[0];
      if (out.kv_held) held_blocks = out.held_block_ids;
    }
  }
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->token_id, reference[0]);
  std::future<absl::Status> landed = done.get_future();
  ASSERT_EQ(landed.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  ASSERT_TRUE(landed.get().ok());

  // Block counts: every layer reported and pushed once, through 4 chunks per region.
  const int64_t prompt_blocks = NumBlocksFor(kPromptLen, kBlockSize);
  ASSERT_EQ(static_cast<int64_t>(observer->blocks.size()), prompt_blocks);
  EXPECT_EQ(observer->layers_reported, num_layers);
  EXPECT_EQ((*push)->num_groups_pushed(), num_layers);
  const transfer::StagedTransferStats stats = (*staged)->stats();
  EXPECT_EQ(stats.num_chunks, static_cast<int64_t>(prefill_regions.size()) * 4);
  int64_t layer_bytes = 0;
  for (const transfer::KvRegion& r : prefill_regions) layer_bytes += r.block_bytes * prompt_blocks;
  EXPECT_EQ(stats.bytes_pushed, layer_bytes);
  EXPECT_EQ((*push)->bytes_pushed(), layer_bytes);
  EXPECT_EQ((*prefill_agent)->stats().bytes_pushed, layer_bytes);  // all by RMA from staging
  // The prefill KV itself is out of the transport's reach: a direct push is refused.
  EXPECT_EQ((*prefill_agent)
                ->Push(*descriptor, transfer::CoalesceBlocks(*reserved), prefill_regions,
                       transfer::CoalesceBlocks(observer->blocks), absl::Now() + absl::Seconds(5))
                .code(),
            absl::StatusCode::kFailedPrecondition);

  // Exact bytes: every region's prompt blocks on decode equal prefill's.
  const std::vector<int32_t> decode_prompt_blocks(reserved->begin(),
                                                  reserved->begin() + prompt_blocks);
  for (size_t r = 0; r < prefill_regions.size(); ++r) {
    EXPECT_EQ(BlockBytes(decode_regions[r], decode_prompt_blocks),
              BlockBytes(prefill_regions[r], observer->blocks))
        << "region " << r;
  }
  ASSERT_TRUE(prefill->ReleaseHeldBlocks("r").ok());

  // Decode continues from the pushed KV: the single engine's tokens.
  ASSERT_TRUE(decode->CompleteTransfer("r", absl::OkStatus(), first).ok());
  std::vector<int32_t> tokens = {first->token_id};
  for (int i = 0; i < 200 && decode->HasUnfinishedRequests(); ++i) {
    for (const RequestOutput& out : decode->Step()) {
      ASSERT_TRUE(out.status.ok()) << out.status;
      for (const SampledToken& t : out.new_tokens) tokens.push_back(t.token_id);
    }
  }
  EXPECT_EQ(tokens, reference);
  EXPECT_EQ(decode->counters().num_prompt_tokens_computed, 0);  // nothing recomputed
  EXPECT_EQ(prefill->num_free_blocks(), free_prefill);
  EXPECT_EQ(decode->num_free_blocks(), free_decode);
}

}  // namespace
}  // namespace sluice
