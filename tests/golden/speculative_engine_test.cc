// Speculative decoding in the engine (engine/spec/): greedy output with speculation is token for
// token the output without it — on sluice-mini-moe with the sluice-mini-draft draft model and on
// llama-tiny with n-gram prompt lookup — with several choices of one prompt, the target's
// logprobs and top logprobs, max_tokens, stop ids and penalties; the draft model's KV is paged
// and prefix-cached.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "engine/model/model.h"
#include "engine/sched/llm_engine.h"
#include "engine/spec/draft_model_drafter.h"
#include "engine/spec/ngram_drafter.h"
#include "engine/spec/speculative.h"
#include "tests/util/fake_models.h"
#include "tests/util/spec_results.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

constexpr int64_t kBlockSize = 16;

using Result = testing::RequestResult;

std::unique_ptr<Model> Load(const std::string& dir) {
  auto model = LoadModel(dir);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

DraftModelOptions DraftOptions(int64_t num_blocks = 256) {
  DraftModelOptions options;
  options.block_size = kBlockSize;
  options.num_kv_blocks = num_blocks;
  options.model_id = "sluice-mini-draft";
  // Auto mode prices steps on this clock: the process's CPU time, not wall time, so other
  // processes on a loaded machine do not change which draft lengths it picks.
  options.cost_clock = CostClock::kProcessCpu;
  return options;
}

std::shared_ptr<DraftModelDrafter> DraftModel(int64_t num_blocks = 256, int32_t draft_vocab = 0,
                                              bool bf16_weights = true) {
  DraftModelOptions options = DraftOptions(num_blocks);
  options.draft_vocab = draft_vocab;
  options.bf16_weights = bf16_weights;
  auto drafter = DraftModelDrafter::Create(Load(testing::SharedModelDir("sluice-mini-draft")),
                                           options);
  EXPECT_TRUE(drafter.ok()) << drafter.status();
  return drafter.ok() ? std::shared_ptr<DraftModelDrafter>(std::move(*drafter)) : nullptr;
}

std::unique_ptr<LLMEngine> Engine(const std::string& dir, std::shared_ptr<Drafter> drafter,
                                  VerifyMode mode = VerifyMode::kFixed, int32_t k = 5,
                                  int32_t max_num_batched_tokens = 512) {
  EngineOptions options;
  options.block_size = kBlockSize;
  options.num_kv_blocks = 256;
  options.max_num_batched_tokens = max_num_batched_tokens;
  options.speculative.drafter = std::move(drafter);
  options.speculative.verify = mode;
  options.speculative.num_speculative_tokens = k;
  options.speculative.cost_clock = CostClock::kProcessCpu;
  auto engine = LLMEngine::Create(Load(dir), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

std::map<std::string, Result> RunAll(LLMEngine& engine, const std::vector<EngineRequest>& requests) {
  std::map<std::string, Result> results;
  for (const EngineRequest& r : requests) EXPECT_TRUE(engine.AddRequest(r).ok());
  for (int steps = 0; engine.HasUnfinishedRequests() && steps < 10000; ++steps) {
    testing::AddOutputs(engine.Step(), &results);
  }
  EXPECT_FALSE(engine.HasUnfinishedRequests());
  return results;
}

using testing::GreedyRequest;
constexpr auto Encode = testing::EncodeText;
constexpr auto ExpectSame = testing::ExpectSameResults;

// Requests covering what must stay exact: two choices of one prompt, top logprobs, a
// repetition penalty, a frequency penalty, a stop id taken from the plain output, max_tokens.
std::vector<EngineRequest> MiniMoeRequests(const std::string& dir) {
  const std::string texts[] = {
      "Ge1:1 In the beginning God created the heaven and the earth. Ge1:2 And the earth was "
      "without form, and void; and darkness was upon the face of the deep. Ge1:3 And God said,",
      "Joh3:16 For God so loved the world,",
      "Ps23:1 The LORD is my shepherd;",
      "Ex20:3 Thou shalt have no other gods",
  };
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back(GreedyRequest("p" + std::to_string(i), Encode(dir, texts[i]), 40));
  }
  requests.push_back(GreedyRequest("p0-choice1", requests[0].prompt_token_ids, 40));
  requests[1].sampling.logprobs = 3;
  requests[2].sampling.repetition_penalty = 1.3f;
  requests[3].sampling.frequency_penalty = 0.5f;
  requests[3].sampling.max_tokens = 13;
  return requests;
}

TEST(SpeculativeEngineTest, DraftModelGreedyEqualsPlainOnMiniMoe) {
  const std::string dir = testing::SharedModelDir("sluice-mini-moe");
  std::vector<EngineRequest> requests = MiniMoeRequests(dir);
  auto plain_engine = Engine(dir, nullptr);
  ASSERT_NE(plain_engine, nullptr);
  const auto plain = RunAll(*plain_engine, requests);
  // A stop id that occurs mid-output: the spec run must stop at the same place.
  EngineRequest stop = GreedyRequest("stop-id", requests[0].prompt_token_ids, 40);
  ASSERT_GT(plain.at("p0").tokens.size(), 10u);
  stop.sampling.stop_token_ids = {plain.at("p0").tokens[9]};
  requests.push_back(stop);
  const auto plain_all = RunAll(*plain_engine, requests);
  EXPECT_LE(plain_all.at("stop-id").tokens.size(), 10u);
  EXPECT_EQ(plain_all.at("stop-id").reason, FinishReason::kStop);

  for (VerifyMode mode : {VerifyMode::kFixed, VerifyMode::kAuto}) {
    SCOPED_TRACE(mode == VerifyMode::kFixed ? "fixed k=5" : "auto");
    auto drafter = DraftModel();
    auto engine = Engine(dir, drafter, mode);
    ASSERT_NE(engine, nullptr);
    const auto spec = RunAll(*engine, requests);
    ExpectSame(plain_all, spec);
    const EngineCounters c = engine->counters();
    EXPECT_GT(c.num_spec_verifications, 0);
    EXPECT_GT(c.num_spec_accepted_tokens, 0);
    EXPECT_LE(c.num_spec_accepted_tokens, c.num_spec_draft_tokens);
    // Several tokens per step: fewer outputs than tokens for the long greedy requests.
    EXPECT_LT(spec.at("p0").num_outputs, static_cast<int32_t>(spec.at("p0").tokens.size()));
    // Every draft state was released with its request; the draft prefix cache kept blocks.
    EXPECT_EQ(drafter->num_sequences(), 0);
    EXPECT_EQ(drafter->num_free_blocks(), drafter->num_total_blocks());
    // A later request with p0's prompt finds its full blocks in the draft's prefix cache.
    EngineRequest again = requests[0];
    again.request_id = "p0-again";
    const auto rerun = RunAll(*engine, {again});
    EXPECT_EQ(rerun.at("p0-again").tokens, plain_all.at("p0").tokens);
    EXPECT_GT(drafter->prefix_cache_stats().num_hit_blocks, 0);
  }
}

TEST(SpeculativeEngineTest, TightBudgetAndDraftBlocksStillExact) {
  // A step budget smaller than the batch's drafts cuts them, and a draft cache of few blocks
  // leaves some sequences without drafts: output unchanged.
  const std::string dir = testing::SharedModelDir("sluice-mini-moe");
  const std::vector<EngineRequest> requests = MiniMoeRequests(dir);
  auto plain_engine = Engine(dir, nullptr);
  const auto plain = RunAll(*plain_engine, requests);
  auto drafter = DraftModel(/*num_blocks=*/6);
  auto engine = Engine(dir, drafter, VerifyMode::kFixed, 5, /*max_num_batched_tokens=*/16);
  ASSERT_NE(engine, nullptr);
  ExpectSame(plain, RunAll(*engine, requests));
  EXPECT_GT(engine->counters().num_spec_verifications, 0);
  EXPECT_EQ(drafter->num_free_blocks(), drafter->num_total_blocks());
}

// TokenLimitModel forwards to `inner` and records the most tokens one Forward held.
class TokenLimitModel final : public Model {
 public:
  explicit TokenLimitModel(std::unique_ptr<Model> inner, int64_t* max_tokens)
      : inner_(std::move(inner)), max_tokens_(max_tokens) {}
  const ModelConfig& config() const override { return inner_->config(); }
  KvCacheSpec kv_cache_spec() const override { return inner_->kv_cache_spec(); }
  int64_t WeightBytesPerToken() const override { return inner_->WeightBytesPerToken(); }
  absl::Status StoreWeightsBf16() override { return inner_->StoreWeightsBf16(); }
  absl::Status Forward(const ForwardInput& input, KvCache& kv_cache,
                       absl::Span<float> logits) override {
    *max_tokens_ = std::max<int64_t>(*max_tokens_, static_cast<int64_t>(input.token_ids.size()));
    return inner_->Forward(input, kv_cache, logits);
  }

 private:
  std::unique_ptr<Model> inner_;
  int64_t* max_tokens_;
};

// A draft model whose forwards hold at most 8 tokens (a CUDA draft runner's max_num_tokens):
// catch-up chunks are split, the drafts are those of an unlimited drafter and the output the
// plain one.
TEST(SpeculativeEngineTest, DraftForwardTokenLimitSplitsCatchUpChunks) {
  const std::string dir = testing::SharedModelDir("sluice-mini-moe");
  const std::vector<EngineRequest> requests = MiniMoeRequests(dir);
  auto plain_engine = Engine(dir, nullptr);
  const auto plain = RunAll(*plain_engine, requests);
  auto unlimited = Engine(dir, DraftModel(), VerifyMode::kFixed);
  ExpectSame(plain, RunAll(*unlimited, requests));
  int64_t max_tokens = 0;
  DraftModelOptions options = DraftOptions();
  options.max_tokens_per_forward = 8;
  auto drafter = DraftModelDrafter::Create(
      std::make_unique<TokenLimitModel>(Load(testing::SharedModelDir("sluice-mini-draft")),
                                        &max_tokens),
      options);
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  auto limited = Engine(dir, std::shared_ptr<DraftModelDrafter>(*std::move(drafter)),
                        VerifyMode::kFixed);
  ExpectSame(plain, RunAll(*limited, requests));
  EXPECT_LE(max_tokens, 8);
  EXPECT_GT(max_tokens, 5);  // chunks filled up to the limit, not one token at a time
  EXPECT_EQ(limited->counters().num_spec_draft_tokens, unlimited->counters().num_spec_draft_tokens);
  EXPECT_EQ(limited->counters().num_spec_accepted_tokens,
            unlimited->counters().num_spec_accepted_tokens);
}

// FR-Spec (a draft LM head over the most frequent tokens, re-ranked while requests run) and
// float32 draft weights: the output is still the plain one.
TEST(SpeculativeEngineTest, ReducedDraftVocabularyAndFloatDraftStillExact) {
  const std::string dir = testing::SharedModelDir("sluice-mini-moe");
  const std::vector<EngineRequest> requests = MiniMoeRequests(dir);
  auto plain_engine = Engine(dir, nullptr);
  const auto plain = RunAll(*plain_engine, requests);
  for (VerifyMode mode : {VerifyMode::kFixed, VerifyMode::kAuto}) {
    SCOPED_TRACE(mode == VerifyMode::kFixed ? "fixed k=5" : "auto");
    auto drafter = DraftModel(256, /*draft_vocab=*/512);
    ASSERT_NE(drafter, nullptr);
    ASSERT_EQ(drafter->draft_vocab_ids().size(), 512u);
    const std::vector<int32_t> initial = drafter->draft_vocab_ids();
    auto engine = Engine(dir, drafter, mode);
    ExpectSame(plain, RunAll(*engine, requests));
    EXPECT_GT(engine->counters().num_spec_accepted_tokens, 0);
    // Re-ranked from the counted tokens: ids above 511 that the requests use are in it. Only
    // checked with a fixed draft length: auto mode drafts (and so counts tokens) as its measured
    // step costs decide, so whether it reaches the first re-rank's 256 tokens is not fixed.
    if (mode == VerifyMode::kFixed) EXPECT_NE(drafter->draft_vocab_ids(), initial);
    EXPECT_EQ(drafter->draft_vocab_ids().size(), 512u);
  }
  auto f32 = DraftModel(256, 0, /*bf16_weights=*/false);
  auto engine = Engine(dir, f32, VerifyMode::kFixed);
  ExpectSame(plain, RunAll(*engine, requests));
}

// The drafting options of Model keep the logits' bits: bfloat16 weight storage of a bfloat16
// checkpoint, and a restricted LM head whose columns are the full logits' columns.
TEST(SpeculativeEngineTest, DraftModelOptionsKeepTheLogitsBits) {
  const std::string dir = testing::SharedModelDir("sluice-mini-draft");
  std::unique_ptr<Model> f32 = Load(dir);
  std::unique_ptr<Model> bf16 = Load(dir);
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(bf16, nullptr);
  ASSERT_TRUE(bf16->StoreWeightsBf16().ok());
  const std::vector<int32_t> prompt = Encode(dir, "Ps23:1 The LORD is my shepherd; I shall not");
  const int64_t n = static_cast<int64_t>(prompt.size());
  ForwardInput in;
  in.token_ids = prompt;
  std::vector<int32_t> table = {0, 1, 2, 3};
  for (int64_t i = 0; i < n; ++i) {
    in.positions.push_back(static_cast<int32_t>(i));
    in.slot_mapping.push_back(i);
    in.logits_indices.push_back(static_cast<int32_t>(i));
  }
  in.sequences.push_back({0, static_cast<int32_t>(n), 0, absl::MakeConstSpan(table)});
  const int64_t vocab = f32->config().vocab_size;
  auto forward = [&](Model& m) {
    KvCache cache(m.kv_cache_spec(), 4, kBlockSize);
    std::vector<float> logits(static_cast<size_t>(n * m.logits_width()));
    EXPECT_TRUE(m.Forward(in, cache, absl::MakeSpan(logits)).ok());
    return logits;
  };
  const std::vector<float> full = forward(*f32);
  EXPECT_EQ(forward(*bf16), full);
  EXPECT_LT(bf16->WeightBytesPerToken(), f32->WeightBytesPerToken() * 6 / 10);
  const std::vector<int32_t> ids = {0, 5, 17, 300, 4095, 8191};
  for (Model* m : {f32.get(), bf16.get()}) {
    ASSERT_TRUE(m->RestrictLogits(ids).ok());
    ASSERT_EQ(m->logits_width(), 6);
    const std::vector<float> part = forward(*m);
    for (int64_t r = 0; r < n; ++r) {
      for (size_t c = 0; c < ids.size(); ++c) {
        ASSERT_EQ(part[r * 6 + c], full[r * vocab + ids[c]]) << "row " << r << " id " << ids[c];
      }
    }
    ASSERT_TRUE(m->RestrictLogits({}).ok());
    EXPECT_EQ(m->logits_width(), vocab);
    EXPECT_EQ(forward(*m), full);
  }
  const absl::Status bad = f32->RestrictLogits(std::vector<int32_t>{3, 8192});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("8192"), std::string::npos);
  // A model without the options says so (the drafter then keeps float32 weights).
  std::unique_ptr<Model> moe = Load(testing::SharedModelDir("sluice-mini-moe"));
  EXPECT_EQ(moe->StoreWeightsBf16().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(moe->RestrictLogits(ids).code(), absl::StatusCode::kUnimplemented);
}

TEST(SpeculativeEngineTest, NgramGreedyEqualsPlainOnLlamaTiny) {
  const std::string dir = testing::FixtureDir("llama-tiny");
  std::vector<EngineRequest> requests;
  // A repetitive prompt so lookup finds matches; and one without repeats.
  std::vector<int32_t> repetitive;
  for (int r = 0; r < 6; ++r) {
    for (int32_t t : {100, 200, 300, 400, 500, 600, 700}) repetitive.push_back(t + r % 2);
  }
  requests.push_back(GreedyRequest("rep", repetitive, 48));
  requests.push_back(GreedyRequest("rep-choice1", repetitive, 48));
  requests.push_back(GreedyRequest("text", Encode(dir, "the cat sat on the mat and the cat"), 32));
  requests[1].sampling.logprobs = 2;
  requests[2].sampling.presence_penalty = 0.4f;
  auto plain_engine = Engine(dir, nullptr);
  const auto plain = RunAll(*plain_engine, requests);
  for (VerifyMode mode : {VerifyMode::kFixed, VerifyMode::kAuto}) {
    auto engine = Engine(dir, std::make_shared<NgramDrafter>(), mode);
    ASSERT_NE(engine, nullptr);
    ExpectSame(plain, RunAll(*engine, requests));
    EXPECT_GT(engine->counters().num_spec_verifications, 0);
  }
}

// Sampled requests with n-gram drafts (a deterministic proposal) take each position's own
// seeded draw, the draft accepted when it is that token: the output is the output without
// speculation, whatever k and whichever drafts the auto scheduler verifies. sluice-mini-moe
// continues Numbers 7's repeated offering formula by quoting it, so drafts get accepted.
TEST(SpeculativeEngineTest, NgramSampledEqualsPlainOnMiniMoe) {
  const std::string dir = testing::SharedModelDir("sluice-mini-moe");
  const std::vector<int32_t> quote = Encode(
      dir,
      "Num7:13 And his offering was one silver charger, the weight thereof was an hundred and "
      "thirty shekels, one silver bowl of seventy shekels, after the shekel of the sanctuary; "
      "both of them were full of fine flour mingled with oil for a meat offering:\n"
      "Num7:14 One spoon of ten shekels of gold, full of incense:\n"
      "Num7:15 One young bullock, one ram, one lamb of the first year, for a burnt offering:\n"
      "Num7:16 One kid of the goats for a sin offering:\n"
      "Num7:18 On the second day Nethaneel the son of Zuar, prince of Issachar, did offer:\n"
      "Num7:19 He offered for his offering one silver charger,");
  std::vector<EngineRequest> requests;
  for (const char* id : {"cold", "top-p", "warm", "hot"}) {
    requests.push_back(GreedyRequest(id, quote, 40));
  }
  const float temperatures[] = {0.3f, 0.5f, 0.7f, 1.0f};
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].sampling.temperature = temperatures[i];
    requests[i].sampling.seed = 1000 + i;
  }
  requests[1].sampling.top_p = 0.8f;
  requests[1].sampling.logprobs = 2;
  requests[2].sampling.presence_penalty = 0.2f;
  auto plain_engine = Engine(dir, nullptr);
  const auto plain = RunAll(*plain_engine, requests);
  for (auto [mode, k] : {std::pair{VerifyMode::kFixed, 5}, std::pair{VerifyMode::kFixed, 2},
                         std::pair{VerifyMode::kAuto, 5}}) {
    SCOPED_TRACE(::testing::Message() << (mode == VerifyMode::kAuto ? "auto" : "fixed")
                                      << " k=" << k);
    auto engine = Engine(dir, std::make_shared<NgramDrafter>(), mode, k);
    ASSERT_NE(engine, nullptr);
    ExpectSame(plain, RunAll(*engine, requests));
    // Auto verifies what the measured step costs make worth it: a count that depends on timing.
    if (mode == VerifyMode::kFixed) EXPECT_GT(engine->counters().num_spec_accepted_tokens, 20);
  }
}

TEST(SpeculativeEngineTest, NumSpeculativeTokensOutOfRangeIsRefused) {
  EngineOptions options;
  options.num_kv_blocks = 64;
  options.speculative.drafter = std::make_shared<NgramDrafter>();
  for (int32_t k : {0, 17, -1}) {
    options.speculative.num_speculative_tokens = k;
    auto engine = LLMEngine::Create(Load(testing::FixtureDir("llama-tiny")), options);
    ASSERT_FALSE(engine.ok());
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(engine.status().message().find("--num-speculative-tokens"), std::string::npos);
  }
}

}  // namespace
}  // namespace sluice
