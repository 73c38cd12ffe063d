// SWA bounded replay wired into the engine (EngineOptions::swa_replay_tokens):
//  * disaggregation hooks (LLMEngine::CompleteTransfer): a prefill engine holds a prompt's KV,
//    only the full-attention layers are copied into a decode engine's reservation (what the UCX
//    transfer moves with KvTransferLayout::region_indices), and the decode engine replays the
//    sliding layers before its first step;
//  * the KV connector (kvstore): only full-attention layers are stored per block, under a layout
//    identity of their own, and the loading engine replays the last tokens of the loaded prefix. The decode cache starts as NaN, so any read of a sliding-layer entry
// that was neither transferred nor replayed poisons the logits (NaN logprobs).
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_map.h"
#include "engine/kv/block_hash.h"
#include "engine/kv/kv_connector.h"
#include "engine/kv/swa_replay.h"
#include "engine/model/model.h"
#include "engine/sched/llm_engine.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

constexpr int64_t kBlockSize = 16;
constexpr int kMaxTokens = 20;

// FailingReplayModel: the wrapped model, except that a forward replaying the sliding layers
// (ForwardInput::kv_frozen_layers set) fails.
class FailingReplayModel final : public Model {
 public:
  explicit FailingReplayModel(std::unique_ptr<Model> inner) : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  KvCacheSpec kv_cache_spec() const override { return inner_->kv_cache_spec(); }
  int64_t WeightBytesPerToken() const override { return inner_->WeightBytesPerToken(); }
  absl::Status Forward(const ForwardInput& in, KvCache& kv, absl::Span<float> logits) override {
    if (!in.kv_frozen_layers.empty()) return absl::InternalError("replay forward failed");
    return inner_->Forward(in, kv, logits);
  }
  bool SupportsSwaReplay() const override { return true; }

 private:
  std::unique_ptr<Model> inner_;
};

// `connector` (may be null): a KV connector shared with other engines, as the kvstore is.
// `failing_replay`: the model's sliding-window replays fail (FailingReplayModel).
std::unique_ptr<LLMEngine> HybridTinyEngine(
    int64_t swa_replay_tokens, std::shared_ptr<KvConnector> connector = nullptr,
    bool failing_replay = false,
    std::function<void(const RecomputeEvent&)> on_recompute = nullptr) {
  auto model = LoadModel(sluice::testing::FixtureDir("qwen3-hybrid-tiny"));
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  if (failing_replay) *model = std::make_unique<FailingReplayModel>(*std::move(model));
  EngineOptions options;
  options.on_recompute = std::move(on_recompute);
  options.block_size = kBlockSize;
  options.num_kv_blocks = 64;
  options.swa_replay_tokens = swa_replay_tokens;
  options.model_id = "qwen3-hybrid-tiny";
  options.kv_connector = std::move(connector);
  auto engine = LLMEngine::Create(std::move(*model), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// PoisonCache fills every K/V entry with NaN: an entry read before it was written (transferred,
// loaded, replayed or computed) turns the logits, hence the logprobs, into NaN.
void PoisonCache(KvCache& cache) {
  const KvCacheSpec& spec = cache.spec();
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    std::fill_n(cache.k(l), cache.num_blocks() * kBlockSize * spec.k_floats_per_token,
                std::numeric_limits<float>::quiet_NaN());
    std::fill_n(cache.v(l), cache.num_blocks() * kBlockSize * spec.v_floats_per_token,
                std::numeric_limits<float>::quiet_NaN());
  }
}

std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(10 + (i * 37 + i / 7) % 8000);
  return p;
}

EngineRequest Greedy(const std::string& id, const std::vector<int32_t>& prompt, bool hold) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = prompt;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = kMaxTokens;
  r.sampling.ignore_eos = true;
  r.hold_kv_blocks = hold;
  return r;
}

// Runs `id` to completion; appends its tokens to *tokens and their logprobs to *logprobs.
void Drain(LLMEngine& engine, const std::string& id, std::vector<int32_t>* tokens,
           std::vector<float>* logprobs, RequestOutput* last = nullptr) {
  for (int i = 0; i < 1000; ++i) {
    for (const RequestOutput& out : engine.Step()) {
      if (out.request_id != id) continue;
      for (const SampledToken& t : out.new_tokens) {
        tokens->push_back(t.token_id);
        if (logprobs != nullptr) logprobs->push_back(t.logprob);
      }
      if (out.finished()) {
        if (last != nullptr) *last = out;
        return;
      }
    }
  }
  ADD_FAILURE() << id << " did not finish";
}

std::vector<int32_t> SingleEngineTokens(const std::vector<int32_t>& prompt) {
  std::unique_ptr<LLMEngine> engine = HybridTinyEngine(0);
  std::vector<int32_t> tokens;
  if (engine == nullptr) return tokens;
  EXPECT_TRUE(engine->AddRequest(Greedy("ref", prompt, false)).ok());
  Drain(*engine, "ref", &tokens, nullptr);
  return tokens;
}

struct Disaggregated {
  std::vector<int32_t> tokens;  // first token (prefill) then the decode engine's
  std::vector<float> logprobs;  // of the decode engine's tokens
  EngineCounters decode_counters;
  int64_t decode_cached_blocks = 0;
  RequestOutput final_output;
};

// Prefill on one engine, full-attention layers only into `decode`'s reservation, then
// CompleteTransfer(transfer_status) and decode.
Disaggregated PrefillTransferDecode(const std::vector<int32_t>& prompt, LLMEngine& decode,
                                    absl::Status transfer_status = absl::OkStatus()) {
  Disaggregated d;
  std::unique_ptr<LLMEngine> prefill = HybridTinyEngine(0);
  if (prefill == nullptr) return d;
  EXPECT_TRUE(prefill->AddRequest(Greedy("r", prompt, true)).ok());
  std::vector<int32_t> held;
  for (int i = 0; i < 100 && held.empty(); ++i) {
    for (const RequestOutput& out : prefill->Step()) {
      if (!out.kv_held) continue;
      held = out.held_block_ids;
      d.tokens.push_back(out.new_tokens.at(0).token_id);
    }
  }
  EXPECT_FALSE(held.empty()) << "prefill did not hold its blocks";
  if (held.empty()) return d;

  KvCache& cache = decode.kv_cache();
  PoisonCache(cache);
  auto blocks = decode.ReserveForTransfer(Greedy("r", prompt, false), std::nullopt);
  EXPECT_TRUE(blocks.ok()) << blocks.status();
  if (!blocks.ok()) return d;
  auto layout = MakeKvTransferLayout(decode.model().config(), decode.model().kv_cache_spec(),
                                     KvLayerSelection::kFullAttentionOnly);
  EXPECT_TRUE(layout.ok()) << layout.status();
  if (!layout.ok()) return d;
  EXPECT_EQ(layout->layers, (std::vector<int32_t>{1, 3}));
  EXPECT_TRUE(CopyKvLayers(prefill->kv_cache(), held, cache, *blocks,
                           static_cast<int64_t>(prompt.size()), *layout)
                  .ok());
  EXPECT_TRUE(prefill->ReleaseHeldBlocks("r").ok());
  SampledToken first;
  first.token_id = d.tokens.front();
  EXPECT_TRUE(decode.CompleteTransfer("r", transfer_status, first).ok());
  Drain(decode, "r", &d.tokens, &d.logprobs, &d.final_output);
  d.decode_counters = decode.counters();
  d.decode_cached_blocks = decode.num_cached_blocks();
  return d;
}

// R = 128 is past qwen3-hybrid-tiny's exactness bound (2 sliding layers * 15 + 1 = 31): greedy
// decoding after a full-attention-only transfer equals a single engine's.
TEST(SwaReplayEngineTest, FullLayerTransferWithReplayMatchesSingleEngine) {
  ASSERT_EQ(ExactReplayTokens(HybridTinyEngine(0)->model().config()), 31);
  for (int n : {20, 205}) {
    const std::vector<int32_t> prompt = Prompt(n);
    std::unique_ptr<LLMEngine> decode = HybridTinyEngine(kDefaultSwaReplayTokens);
    ASSERT_NE(decode, nullptr);
    EXPECT_EQ(decode->swa_replay_tokens(), kDefaultSwaReplayTokens);
    const Disaggregated d = PrefillTransferDecode(prompt, *decode);
    EXPECT_EQ(d.tokens, SingleEngineTokens(prompt)) << "n " << n;
    EXPECT_EQ(d.decode_counters.num_swa_replays, 1);
    EXPECT_EQ(d.decode_counters.num_swa_replayed_tokens, std::min(n, 128));
    EXPECT_EQ(d.decode_counters.num_transfers_completed, 1);
    EXPECT_EQ(d.decode_counters.num_prompt_tokens_computed, 0);  // the replay is not a prefill
    EXPECT_EQ(d.final_output.finish_reason, FinishReason::kLength);
  }
}

// R = 8 is below the window (16): the replay starts at n - 8 and the first decode steps must
// bound the sliding layers' keys there (Sequence::sliding_kv_start); below it the cache is NaN.
// The prefix-cache rule: blocks holding positions below the replay start are never cached.
TEST(SwaReplayEngineTest, ShortReplayBoundsSlidingKeysAndSkipsAbsentBlocks) {
  const std::vector<int32_t> prompt = Prompt(205);  // replay start 197, inside block 12
  std::unique_ptr<LLMEngine> decode = HybridTinyEngine(8);
  ASSERT_NE(decode, nullptr);
  const Disaggregated d = PrefillTransferDecode(prompt, *decode);
  ASSERT_EQ(d.tokens.size(), static_cast<size_t>(kMaxTokens));
  for (float lp : d.logprobs) EXPECT_TRUE(std::isfinite(lp)) << "a NaN sliding entry was read";
  for (int32_t t : d.tokens) EXPECT_TRUE(t >= 0 && t < 8192);
  EXPECT_EQ(d.decode_counters.num_swa_replayed_tokens, 8);
  // 205 + 19 computed tokens fill blocks 0..13; 0..11 are transferred prompt blocks, 12 holds
  // positions 192..196 without sliding K/V: only block 13 enters the prefix cache.
  EXPECT_EQ(d.decode_cached_blocks, 1);

  // With R = 128 (replay start 77) block 12 is complete after the replay: blocks 12 and 13.
  std::unique_ptr<LLMEngine> full = HybridTinyEngine(kDefaultSwaReplayTokens);
  EXPECT_EQ(PrefillTransferDecode(prompt, *full).decode_cached_blocks, 2);
}

// A transfer that fails with its source gone is recomputed locally (no replay), as without
// SWA replay.
TEST(SwaReplayEngineTest, FailedTransferIsRecomputedWithoutReplay) {
  const std::vector<int32_t> prompt = Prompt(60);
  std::unique_ptr<LLMEngine> decode = HybridTinyEngine(kDefaultSwaReplayTokens);
  ASSERT_NE(decode, nullptr);
  const Disaggregated d =
      PrefillTransferDecode(prompt, *decode, absl::UnavailableError("prefill worker gone"));
  EXPECT_EQ(d.tokens, SingleEngineTokens(prompt));
  EXPECT_EQ(d.decode_counters.num_transfers_recomputed, 1);
  EXPECT_EQ(d.decode_counters.num_swa_replays, 0);
  EXPECT_EQ(d.decode_counters.num_prompt_tokens_computed, 60);
}

// The transfer succeeds but the sliding layers cannot be rebuilt: the transferred KV is not
// used, the prompt is recomputed here (same tokens as one engine), and the recompute is
// reported with its cause, the reserved blocks freed and the prompt tokens to recompute.
TEST(SwaReplayEngineTest, FailedReplayRecomputesThePromptAndSaysWhy) {
  const std::vector<int32_t> prompt = Prompt(60);
  std::vector<RecomputeEvent> recomputes;
  std::unique_ptr<LLMEngine> decode =
      HybridTinyEngine(kDefaultSwaReplayTokens, nullptr, /*failing_replay=*/true,
                       [&](const RecomputeEvent& e) { recomputes.push_back(e); });
  ASSERT_NE(decode, nullptr);
  ASSERT_EQ(decode->swa_replay_tokens(), kDefaultSwaReplayTokens);
  const Disaggregated d = PrefillTransferDecode(prompt, *decode);
  EXPECT_EQ(d.tokens, SingleEngineTokens(prompt));
  EXPECT_EQ(d.decode_counters.num_transfers_recomputed, 1);
  EXPECT_EQ(d.decode_counters.num_swa_replay_recomputes, 1);
  EXPECT_EQ(d.decode_counters.num_transfers_completed, 0);
  EXPECT_EQ(d.decode_counters.num_swa_replays, 0);
  EXPECT_EQ(d.decode_counters.num_prompt_tokens_computed, 60);
  ASSERT_EQ(recomputes.size(), 1u);
  EXPECT_EQ(recomputes[0].request_id, "r");
  EXPECT_EQ(recomputes[0].cause, RecomputeCause::kSwaReplayFailed);
  EXPECT_EQ(recomputes[0].num_blocks_freed, 4);  // prompt + 1 tokens: 61 of 16 per block
  EXPECT_EQ(recomputes[0].num_tokens_to_recompute, 60);
  EXPECT_EQ(recomputes[0].detail, "replay forward failed");
}

// Models without sliding layers, or R = 0, keep every layer (nothing to replay).
TEST(SwaReplayEngineTest, EffectiveReplayTokens) {
  std::unique_ptr<LLMEngine> off = HybridTinyEngine(0);
  ASSERT_NE(off, nullptr);
  EXPECT_EQ(off->swa_replay_tokens(), 0);
  EXPECT_EQ(EffectiveSwaReplayTokens(off->model(), 64), 64);
  auto dense = LoadModel(sluice::testing::EmbeddedModelDir());
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ(EffectiveSwaReplayTokens(**dense, 128), 0);
}

// ---------------------------------------------------------------------------------------------
// The kvstore path: an in-memory KV connector (loads answer at once, in PollLoads) shared by
// two engines, as the kvstore is shared by two workers.
class MemoryConnector final : public KvConnector {
 public:
  absl::Status Bind(const KvConnectorLayout& layout) override {
    layouts.push_back(layout);
    return absl::OkStatus();
  }
  void StartLoad(uint64_t ticket, std::vector<BlockHash> hashes) override {
    KvLoadResult r;
    r.ticket = ticket;
    const int64_t block_bytes = layouts.back().block_bytes;
    std::vector<uint8_t> bytes;
    for (const BlockHash& h : hashes) {
      auto it = blocks.find(h);
      if (it == blocks.end()) break;
      EXPECT_EQ(static_cast<int64_t>(it->second.size()), block_bytes);
      bytes.insert(bytes.end(), it->second.begin(), it->second.end());
      ++r.num_blocks;
    }
    r.bytes = KvBlockBuffer(std::move(bytes));
    done.push_back(std::move(r));
  }
  std::vector<KvLoadResult> PollLoads() override { return std::exchange(done, {}); }
  void Save(std::vector<BlockHash> hashes, KvBlockBuffer bytes) override {
    const size_t block_bytes = bytes.size() / hashes.size();
    saved_bytes.push_back(static_cast<int64_t>(block_bytes));
    for (size_t i = 0; i < hashes.size(); ++i) {
      blocks.try_emplace(hashes[i], bytes.data() + i * block_bytes,
                         bytes.data() + (i + 1) * block_bytes);
    }
  }
  KvConnectorStats stats() const override { return {}; }

  std::vector<KvConnectorLayout> layouts;  // one per Bind
  absl::flat_hash_map<BlockHash, std::vector<uint8_t>> blocks;
  std::vector<int64_t> saved_bytes;  // block bytes of each Save
  std::vector<KvLoadResult> done;
};

// Worker A computes a prompt and writes its blocks through (full-attention layers 1 and 3
// only); worker B, whose cache starts as NaN, loads them, replays the last R tokens and computes
// only the tail: greedy output equals a single engine's (R = 128 >= 31 is exact).
TEST(SwaReplayKvStoreTest, StoresFullLayersOnlyAndReplaysOnLoad) {
  auto store = std::make_shared<MemoryConnector>();
  const std::vector<int32_t> prompt = Prompt(150);
  std::unique_ptr<LLMEngine> a = HybridTinyEngine(kDefaultSwaReplayTokens, store);
  ASSERT_NE(a, nullptr);
  // Layout identity: the engine's, marked full-attention-only; 2 of 4 layers per block.
  ASSERT_EQ(store->layouts.size(), 1u);
  EXPECT_EQ(store->layouts[0].kv_identity, a->kv_identity() + ";stored_layers=1,3");
  const KvCacheSpec spec = a->model().kv_cache_spec();
  const int64_t full_block = KvBlockBytes(spec, kBlockSize);
  EXPECT_EQ(store->layouts[0].block_bytes, full_block / 2);
  std::vector<int32_t> a_tokens;
  ASSERT_TRUE(a->AddRequest(Greedy("a", prompt, false)).ok());
  Drain(*a, "a", &a_tokens, nullptr);
  EXPECT_EQ(a_tokens, SingleEngineTokens(prompt));
  ASSERT_FALSE(store->saved_bytes.empty());
  for (int64_t b : store->saved_bytes) EXPECT_EQ(b, full_block / 2);
  // 150 + 19 computed tokens: 10 full blocks written through.
  EXPECT_EQ(store->blocks.size(), 10u);

  std::unique_ptr<LLMEngine> b = HybridTinyEngine(kDefaultSwaReplayTokens, store);
  ASSERT_NE(b, nullptr);
  KvCache& cache = b->kv_cache();
  PoisonCache(cache);
  std::vector<int32_t> longer = prompt;
  for (int i = 0; i < 30; ++i) longer.push_back(500 + i);
  std::vector<int32_t> b_tokens;
  std::vector<float> logprobs;
  RequestOutput last;
  ASSERT_TRUE(b->AddRequest(Greedy("b", longer, false)).ok());
  Drain(*b, "b", &b_tokens, &logprobs, &last);
  for (float lp : logprobs) EXPECT_TRUE(std::isfinite(lp));
  EXPECT_EQ(b_tokens, SingleEngineTokens(longer));
  // The longer prompt's first 9 blocks (144 tokens; A's 10th holds A's outputs) came from the
  // store; the last 128 of them were replayed and the 36-token tail computed.
  const EngineCounters c = b->counters();
  EXPECT_EQ(last.num_cached_tokens, 144);
  EXPECT_EQ(c.num_prompt_tokens_cached_external, 144);
  EXPECT_EQ(c.num_swa_replays, 1);
  EXPECT_EQ(c.num_swa_replayed_tokens, 128);
  EXPECT_EQ(c.num_prompt_tokens_computed, 36);
}

// As above, but B's replay fails: the 144 loaded tokens cannot be used without the sliding
// layers, so B computes the whole prompt (same output) and reports why.
TEST(SwaReplayKvStoreTest, FailedReplayAfterLoadComputesTheLoadedTokensAndSaysWhy) {
  auto store = std::make_shared<MemoryConnector>();
  const std::vector<int32_t> prompt = Prompt(150);
  std::unique_ptr<LLMEngine> a = HybridTinyEngine(kDefaultSwaReplayTokens, store);
  ASSERT_NE(a, nullptr);
  std::vector<int32_t> ignored;
  ASSERT_TRUE(a->AddRequest(Greedy("a", prompt, false)).ok());
  Drain(*a, "a", &ignored, nullptr);
  std::vector<RecomputeEvent> recomputes;
  std::unique_ptr<LLMEngine> b =
      HybridTinyEngine(kDefaultSwaReplayTokens, store, /*failing_replay=*/true,
                       [&](const RecomputeEvent& e) { recomputes.push_back(e); });
  ASSERT_NE(b, nullptr);
  std::vector<int32_t> longer = prompt;
  for (int i = 0; i < 30; ++i) longer.push_back(500 + i);
  std::vector<int32_t> b_tokens;
  ASSERT_TRUE(b->AddRequest(Greedy("b", longer, false)).ok());
  Drain(*b, "b", &b_tokens, nullptr);
  EXPECT_EQ(b_tokens, SingleEngineTokens(longer));
  EXPECT_EQ(b->counters().num_swa_replays, 0);
  EXPECT_EQ(b->counters().num_prompt_tokens_computed, 180);
  ASSERT_EQ(recomputes.size(), 1u);
  EXPECT_EQ(recomputes[0].request_id, "b");
  EXPECT_EQ(recomputes[0].cause, RecomputeCause::kKvstoreSwaReplayFailed);
  EXPECT_EQ(recomputes[0].num_blocks_freed, 0);  // kept, and overwritten by the computation
  EXPECT_EQ(recomputes[0].num_tokens_to_recompute, 144);
  EXPECT_EQ(recomputes[0].detail, "replay forward failed");
  // Counted under its cause (sluice_recomputes_total{cause="kvstore_swa_replay_failed"}).
  EXPECT_EQ(b->counters().num_kvstore_swa_replay_recomputes, 1);
  EXPECT_EQ(b->counters().num_swa_replay_recomputes, 0);
}

// R = 8 (below the window of 16): the replay of the loaded prefix starts 8 tokens before its
// end; the tail's first chunk must bound the sliding layers' keys there (the cache below is NaN).
TEST(SwaReplayKvStoreTest, ShortReplayAfterLoadBoundsSlidingKeys) {
  auto store = std::make_shared<MemoryConnector>();
  const std::vector<int32_t> prompt = Prompt(150);
  std::unique_ptr<LLMEngine> a = HybridTinyEngine(8, store);
  ASSERT_NE(a, nullptr);
  std::vector<int32_t> ignored;
  ASSERT_TRUE(a->AddRequest(Greedy("a", prompt, false)).ok());
  Drain(*a, "a", &ignored, nullptr);

  std::unique_ptr<LLMEngine> b = HybridTinyEngine(8, store);
  ASSERT_NE(b, nullptr);
  KvCache& cache = b->kv_cache();
  PoisonCache(cache);
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  RequestOutput last;
  ASSERT_TRUE(b->AddRequest(Greedy("b", prompt, false)).ok());
  Drain(*b, "b", &tokens, &logprobs, &last);
  ASSERT_EQ(tokens.size(), static_cast<size_t>(kMaxTokens));
  for (float lp : logprobs) EXPECT_TRUE(std::isfinite(lp)) << "a NaN sliding entry was read";
  EXPECT_EQ(last.num_cached_tokens, 144);
  EXPECT_EQ(b->counters().num_swa_replayed_tokens, 8);
  EXPECT_EQ(b->counters().num_prompt_tokens_computed, 6);
}

// Without replay the same store keeps every layer under the plain identity: the two layouts
// never share a key.
TEST(SwaReplayKvStoreTest, ReplayOffStoresEveryLayerUnderAnotherIdentity) {
  auto store = std::make_shared<MemoryConnector>();
  std::unique_ptr<LLMEngine> off = HybridTinyEngine(0, store);
  std::unique_ptr<LLMEngine> on = HybridTinyEngine(kDefaultSwaReplayTokens, store);
  ASSERT_NE(off, nullptr);
  ASSERT_NE(on, nullptr);
  ASSERT_EQ(store->layouts.size(), 2u);
  EXPECT_EQ(store->layouts[0].kv_identity, off->kv_identity());
  EXPECT_EQ(store->layouts[0].block_bytes, KvBlockBytes(off->model().kv_cache_spec(), kBlockSize));
  const BlockHasher plain(store->layouts[0].kv_identity, kBlockSize);
  const BlockHasher full_only(store->layouts[1].kv_identity, kBlockSize);
  EXPECT_NE(plain.seed(), full_only.seed());  // the kvstore's layout id (KvStoreKey)
}

}  // namespace
}  // namespace sluice
