// Prompt logprobs from the engine (SamplingParams::prompt_logprobs): every prompt token after
// the first is scored from the logits of the position before it, also across prefill chunks,
// with prefix caching on (nothing reused for such a request) and after a preemption.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/sched/llm_engine.h"
#include "tests/util/fake_models.h"

namespace sluice {
namespace {

using testing::ChecksumModel;
constexpr int64_t kVocab = ChecksumModel::kVocab;

std::vector<int32_t> Prompt(int len) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(3 + (i * 7) % (kVocab - 3));
  return p;
}

// The ChecksumModel's row for position p: 10 at Next(sum(tokens[0..p]), p), 0 elsewhere.
PromptLogprob Expected(const std::vector<int32_t>& prompt, int32_t p) {
  int64_t sum = 0;
  for (int32_t i = 0; i <= p; ++i) sum += prompt[i];
  const int32_t top = ChecksumModel::Next(sum, p);
  const double lse = std::log(std::exp(10.0) + static_cast<double>(kVocab - 1));
  PromptLogprob want;
  want.token_id = prompt[p + 1];
  want.logprob = static_cast<float>((prompt[p + 1] == top ? 10.0 : 0.0) - lse);
  want.rank = prompt[p + 1] == top ? 1 : 2;
  want.top_logprobs = {{top, static_cast<float>(10.0 - lse)}};
  return want;
}

std::vector<RequestOutput> RunAll(LLMEngine& engine) {
  std::vector<RequestOutput> outs;
  for (int i = 0; i < 1000 && engine.HasUnfinishedRequests(); ++i) {
    for (RequestOutput& out : engine.Step()) outs.push_back(std::move(out));
  }
  return outs;
}

class PromptLogprobsTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(PromptLogprobsTest, EveryPromptTokenIsScoredOnceWithTheFirstToken) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 64;
  options.max_num_batched_tokens = GetParam();  // small budgets split the prompt into chunks
  options.enable_prefix_caching = true;
  auto engine = LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> prompt = Prompt(23);
  // A first request fills the prefix cache with this prompt's blocks.
  EngineRequest warm;
  warm.request_id = "warm";
  warm.prompt_token_ids = prompt;
  warm.sampling.temperature = 0.0f;
  warm.sampling.max_tokens = 1;
  ASSERT_TRUE((*engine)->AddRequest(warm).ok());
  RunAll(**engine);

  EngineRequest r = warm;
  r.request_id = "scored";
  r.sampling.max_tokens = 3;
  r.sampling.prompt_logprobs = 1;
  ASSERT_TRUE((*engine)->AddRequest(r).ok());
  std::vector<RequestOutput> outs = RunAll(**engine);
  int with_prompt_logprobs = 0;
  for (const RequestOutput& out : outs) {
    if (out.prompt_logprobs.empty()) continue;
    ++with_prompt_logprobs;
    ASSERT_EQ(out.new_tokens.size(), 1u);
    EXPECT_EQ(out.num_output_tokens, 1);  // with the first token
    EXPECT_EQ(out.num_cached_tokens, 0);  // every position computed
    ASSERT_EQ(out.prompt_logprobs.size(), prompt.size() - 1);
    for (int32_t p = 0; p + 1 < static_cast<int32_t>(prompt.size()); ++p) {
      const PromptLogprob want = Expected(prompt, p);
      const PromptLogprob& got = out.prompt_logprobs[p];
      EXPECT_EQ(got.token_id, want.token_id) << p;
      EXPECT_NEAR(got.logprob, want.logprob, 1e-5) << p;
      EXPECT_EQ(got.rank, want.rank) << p;
      ASSERT_EQ(got.top_logprobs.size(), 1u);
      EXPECT_EQ(got.top_logprobs[0].token_id, want.top_logprobs[0].token_id);
      EXPECT_NEAR(got.top_logprobs[0].logprob, want.top_logprobs[0].logprob, 1e-5);
    }
  }
  EXPECT_EQ(with_prompt_logprobs, 1);
  // The generated tokens are those of an ordinary request.
  std::vector<int32_t> tokens;
  for (const RequestOutput& out : outs) {
    for (const SampledToken& t : out.new_tokens) tokens.push_back(t.token_id);
  }
  EXPECT_EQ(tokens, ChecksumModel::Reference(prompt, 3));
}

INSTANTIATE_TEST_SUITE_P(Budgets, PromptLogprobsTest, ::testing::Values(512, 5, 4));

TEST(PromptLogprobsEngineTest, PromptOfOneTokenHasNone) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 64;
  auto engine = LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EngineRequest r;
  r.request_id = "a";
  r.prompt_token_ids = {5};
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = 2;
  r.sampling.prompt_logprobs = 0;
  ASSERT_TRUE((*engine)->AddRequest(r).ok());
  for (const RequestOutput& out : RunAll(**engine)) EXPECT_TRUE(out.prompt_logprobs.empty());
}

}  // namespace
}  // namespace sluice
