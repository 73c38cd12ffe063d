// Batch invariance on the CPU backend (EngineOptions::batch_invariant, issue 28): on trained and
// fixture models a seeded sampled request with 20 top logprobs gets, bit for bit, the tokens,
// chosen logprobs and top logprobs it gets alone in an engine with whole-prompt prefill and no
// prefix cache, when it runs
//   - inside batches of 1, 8 and 63 random other requests (greedy, seeded, unseeded; arriving
//     at various steps; some sharing its seed),
//   - with chunked prefill at several chunk sizes (token budgets 3, 8, 17),
//   - with a cold, a partly warm and a fully warm prefix cache,
//   - disaggregated: prompt and first token on one engine, its KV blocks copied to another
//     engine (what transfer/ does) that decodes the rest beside other traffic.
// Logprobs are log_softmax of the whole logits row in double, so 21 bitwise-equal values per
// token pin the row far more tightly than the sampled tokens alone.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "engine/kv/swa_replay.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/sched/llm_engine.h"
#include "tests/util/golden_runner.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

struct InvarianceModel {
  std::string label;
  std::string name;
  bool embedded = false;
  std::string Dir() const {
    return embedded ? sluice::testing::EmbeddedModelDir() : sluice::testing::FixtureDir(name);
  }
};

constexpr int kMaxTokens = 10;
constexpr int kTopLogprobs = 20;

// What a request got: per token, the id, its logprob and the top logprobs.
using Trace = std::vector<SampledToken>;

struct EngineConfig {
  int32_t max_num_batched_tokens = 512;
  bool prefix_caching = false;
};

std::unique_ptr<LLMEngine> MakeEngine(const std::string& dir, const EngineConfig& config) {
  auto model = LoadModel(dir);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 1024;
  options.max_model_len = 256;
  options.max_num_batched_tokens = config.max_num_batched_tokens;
  options.enable_prefix_caching = config.prefix_caching;
  options.batch_invariant = true;
  auto engine = LLMEngine::Create(*std::move(model), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

EngineRequest Target(const std::vector<int32_t>& prompt, const std::string& id = "target") {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = prompt;
  r.sampling.temperature = 0.8f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 1234;
  r.sampling.max_tokens = kMaxTokens;
  r.sampling.ignore_eos = true;  // fixed length: random-weight fixtures emit EOS anywhere
  r.sampling.logprobs = kTopLogprobs;
  return r;
}

struct Arrival {
  int step = 0;
  EngineRequest request;
};

// Runs `arrivals` (sorted by step) to completion; returns every request's trace.
std::map<std::string, Trace> RunArrivals(LLMEngine& engine,
                                         const std::vector<Arrival>& arrivals,
                                         int32_t* target_cached = nullptr) {
  std::map<std::string, Trace> traces;
  size_t next = 0;
  for (int step = 0; step < 100000; ++step) {
    while (next < arrivals.size() && arrivals[next].step <= step) {
      EXPECT_TRUE(engine.AddRequest(arrivals[next].request).ok());
      ++next;
    }
    if (next == arrivals.size() && !engine.HasUnfinishedRequests()) break;
    for (RequestOutput& out : engine.Step()) {
      EXPECT_TRUE(out.status.ok()) << out.request_id << ": " << out.status;
      Trace& trace = traces[out.request_id];
      for (SampledToken& t : out.new_tokens) trace.push_back(std::move(t));
      if (out.finished() && out.request_id == "target" && target_cached != nullptr) {
        *target_cached = out.num_cached_tokens;
      }
    }
  }
  EXPECT_FALSE(engine.HasUnfinishedRequests());
  return traces;
}

// Bitwise comparison of two traces (floats by their bits).
void ExpectBitwiseEqual(const Trace& got, const Trace& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].token_id, want[i].token_id) << "token " << i;
    EXPECT_EQ(std::bit_cast<uint32_t>(got[i].logprob), std::bit_cast<uint32_t>(want[i].logprob))
        << "token " << i << ": " << got[i].logprob << " vs " << want[i].logprob;
    ASSERT_EQ(got[i].top_logprobs.size(), want[i].top_logprobs.size()) << "token " << i;
    for (size_t k = 0; k < want[i].top_logprobs.size(); ++k) {
      EXPECT_EQ(got[i].top_logprobs[k].token_id, want[i].top_logprobs[k].token_id)
          << "token " << i << " top " << k;
      EXPECT_EQ(std::bit_cast<uint32_t>(got[i].top_logprobs[k].logprob),
                std::bit_cast<uint32_t>(want[i].top_logprobs[k].logprob))
          << "token " << i << " top " << k;
    }
  }
}

// `count` random other requests arriving over the first steps, and the target at `target_step`.
std::vector<Arrival> WithOthers(const EngineRequest& target, int count, int target_step,
                                int32_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
  std::vector<Arrival> arrivals;
  for (int i = 0; i < count; ++i) {
    EngineRequest r;
    r.request_id = absl::StrCat("other", i);
    const int len = uniform(1, 40);
    for (int t = 0; t < len; ++t) r.prompt_token_ids.push_back(uniform(2, vocab - 1));
    if (i % 5 == 0) {  // a prefix of the target's prompt: shares its cached blocks
      r.prompt_token_ids.assign(target.prompt_token_ids.begin(),
                                target.prompt_token_ids.begin() +
                                    uniform(1, static_cast<int>(target.prompt_token_ids.size())));
    }
    r.sampling.max_tokens = uniform(1, 14);
    r.sampling.ignore_eos = true;
    switch (i % 3) {
      case 0:
        r.sampling.temperature = 0.0f;
        break;
      case 1:
        r.sampling.temperature = 1.0f;
        r.sampling.seed = target.sampling.seed;  // the target's seed on another prompt
        r.sampling.logprobs = uniform(0, 5);
        break;
      default:
        r.sampling.temperature = 0.7f;
        r.sampling.top_k = uniform(1, 50);
        break;
    }
    arrivals.push_back({uniform(0, 4), std::move(r)});
  }
  arrivals.push_back({target_step, target});
  std::stable_sort(arrivals.begin(), arrivals.end(),
                   [](const Arrival& a, const Arrival& b) { return a.step < b.step; });
  return arrivals;
}

class BatchInvarianceTest : public ::testing::TestWithParam<InvarianceModel> {
 protected:
  void SetUp() override {
    dir_ = GetParam().Dir();
    auto cases = sluice::testing::LoadGoldenCases(dir_ + "/golden.safetensors");
    ASSERT_TRUE(cases.ok()) << cases.status();
    ASSERT_GE(cases->size(), 2u);
    // Long enough for several chunks and blocks; on qwen3-hybrid-tiny beyond its window.
    prompt_ = (*cases)[0].input_ids;
    prompt_.insert(prompt_.end(), (*cases)[1].input_ids.begin(), (*cases)[1].input_ids.end());
    auto alone = MakeEngine(dir_, {});
    ASSERT_NE(alone, nullptr);
    vocab_ = static_cast<int32_t>(alone->model().config().vocab_size);
    want_ = RunArrivals(*alone, {{0, Target(prompt_)}}).at("target");
    ASSERT_EQ(want_.size(), static_cast<size_t>(kMaxTokens));
  }

  std::string dir_;
  std::vector<int32_t> prompt_;
  int32_t vocab_ = 0;
  Trace want_;
};

TEST_P(BatchInvarianceTest, SameBitsInsideRandomBatches) {
  auto engine = MakeEngine(dir_, {});
  ASSERT_NE(engine, nullptr);
  for (int others : {1, 8, 63}) {
    SCOPED_TRACE(absl::StrCat(others, " other requests"));
    const auto traces = RunArrivals(
        *engine, WithOthers(Target(prompt_), others, others % 3, vocab_, 100 + others));
    ExpectBitwiseEqual(traces.at("target"), want_);
    EXPECT_EQ(traces.size(), static_cast<size_t>(others + 1));
  }
}

TEST_P(BatchInvarianceTest, SameBitsWithChunkedPrefill) {
  for (int32_t budget : {3, 8, 17}) {
    SCOPED_TRACE(absl::StrCat("token budget ", budget));
    auto engine = MakeEngine(dir_, {.max_num_batched_tokens = budget});
    ASSERT_NE(engine, nullptr);
    ExpectBitwiseEqual(RunArrivals(*engine, {{0, Target(prompt_)}}).at("target"), want_);
    // Chunks shared with other requests' prefills and decodes.
    const auto traces = RunArrivals(*engine, WithOthers(Target(prompt_), 6, 1, vocab_, budget));
    ExpectBitwiseEqual(traces.at("target"), want_);
  }
}

TEST_P(BatchInvarianceTest, SameBitsWithColdAndWarmPrefixCache) {
  auto engine = MakeEngine(dir_, {.max_num_batched_tokens = 16, .prefix_caching = true});
  ASSERT_NE(engine, nullptr);
  int32_t cached = -1;
  ExpectBitwiseEqual(RunArrivals(*engine, {{0, Target(prompt_)}}, &cached).at("target"), want_);
  EXPECT_EQ(cached, 0);  // cold
  ExpectBitwiseEqual(RunArrivals(*engine, {{0, Target(prompt_)}}, &cached).at("target"), want_);
  EXPECT_GT(cached, 0);  // warm
  // Partly warm: a fresh engine that has seen only a prefix of the prompt, inside a batch.
  auto partial = MakeEngine(dir_, {.max_num_batched_tokens = 16, .prefix_caching = true});
  ASSERT_NE(partial, nullptr);
  EngineRequest head = Target({prompt_.begin(), prompt_.begin() + prompt_.size() / 2}, "head");
  RunArrivals(*partial, {{0, head}});
  const auto traces = RunArrivals(*partial, WithOthers(Target(prompt_), 8, 2, vocab_, 7), &cached);
  EXPECT_GT(cached, 0);
  ExpectBitwiseEqual(traces.at("target"), want_);
}

// Prefill on one engine, KV blocks (every layer) copied into a reservation on another that
// decodes beside other traffic.
TEST_P(BatchInvarianceTest, SameBitsWhenKvArrivesByTransfer) {
  auto prefill = MakeEngine(dir_, {.max_num_batched_tokens = 8});
  auto decode = MakeEngine(dir_, {.max_num_batched_tokens = 32});
  ASSERT_NE(prefill, nullptr);
  ASSERT_NE(decode, nullptr);
  EngineRequest held = Target(prompt_);
  held.hold_kv_blocks = true;
  std::vector<RequestOutput> pre;
  ASSERT_TRUE(prefill->AddRequest(held).ok());
  while (pre.empty() || !pre.back().finished()) {
    for (RequestOutput& out : prefill->Step()) pre.push_back(std::move(out));
  }
  ASSERT_TRUE(pre.back().kv_held);
  const SampledToken first = pre.back().new_tokens.at(0);

  // Other requests already running on the decode engine.
  for (const Arrival& a : WithOthers(Target(prompt_), 5, 0, vocab_, 11)) {
    if (a.request.request_id != "target") ASSERT_TRUE(decode->AddRequest(a.request).ok());
  }
  decode->Step();
  auto reserved = decode->ReserveForTransfer(Target(prompt_), std::nullopt);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  const KvCacheSpec spec = prefill->model().kv_cache_spec();
  const int64_t bs = prefill->block_size();
  const std::vector<int32_t>& src = pre.back().held_block_ids;
  for (int64_t layer = 0; layer < spec.num_layers; ++layer) {
    for (size_t b = 0; b < src.size(); ++b) {
      std::memcpy(decode->kv_cache().k(layer) + (*reserved)[b] * bs * spec.k_floats_per_token,
                  prefill->kv_cache().k(layer) + src[b] * bs * spec.k_floats_per_token,
                  bs * spec.k_floats_per_token * sizeof(float));
      if (spec.v_floats_per_token == 0) continue;
      std::memcpy(decode->kv_cache().v(layer) + (*reserved)[b] * bs * spec.v_floats_per_token,
                  prefill->kv_cache().v(layer) + src[b] * bs * spec.v_floats_per_token,
                  bs * spec.v_floats_per_token * sizeof(float));
    }
  }
  ASSERT_TRUE(prefill->ReleaseHeldBlocks("target").ok());
  ASSERT_TRUE(decode->CompleteTransfer("target", absl::OkStatus(), first).ok());
  Trace got = {first};
  for (auto& [id, trace] : RunArrivals(*decode, {})) {
    if (id == "target") got.insert(got.end(), trace.begin(), trace.end());
  }
  ExpectBitwiseEqual(got, want_);
}

// Bounded SWA replay rebuilds sliding-window K/V approximately below ExactReplayTokens: refused in
// batch-invariant mode; 0 (transfers move every layer) and exact lengths are accepted.
TEST(BatchInvarianceModeTest, RefusesInexactSwaReplay) {
  const std::string dir = sluice::testing::FixtureDir("qwen3-hybrid-tiny");
  auto create = [&](int64_t replay) {
    auto model = LoadModel(dir);
    EXPECT_TRUE(model.ok()) << model.status();
    EngineOptions options;
    options.block_size = 4;
    options.num_kv_blocks = 256;
    options.max_model_len = 256;
    options.batch_invariant = true;
    options.swa_replay_tokens = replay;
    return LLMEngine::Create(*std::move(model), options).status();
  };
  auto config = ModelConfig::Load(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  const int64_t exact = ExactReplayTokens(*config);
  ASSERT_GT(exact, 1);
  const absl::Status inexact = create(exact - 1);
  EXPECT_EQ(inexact.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(inexact.message().find(absl::StrCat("at least ", exact)), std::string::npos)
      << inexact;
  EXPECT_TRUE(create(0).ok());
  EXPECT_TRUE(create(exact).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Models, BatchInvarianceTest,
    ::testing::Values(InvarianceModel{"llama_tiny", "llama-tiny"},
                      InvarianceModel{"qwen3_hybrid_tiny", "qwen3-hybrid-tiny"},
                      InvarianceModel{"sluice_mini_moe", "sluice-mini-moe", true}),
    [](const ::testing::TestParamInfo<InvarianceModel>& info) { return info.param.label; });

}  // namespace
}  // namespace sluice
