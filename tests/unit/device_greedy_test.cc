// LLMEngine's device greedy path (Model::ForwardGreedy, issue 5): a step uses it exactly when
// the model supports it and every sampling row is a plain argmax (IsPlainGreedy); otherwise the
// full-logits path runs. Either way the tokens and logprobs must be those of host sampling,
// checked against the same requests on the same model with ForwardGreedy switched off.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "engine/model/model.h"
#include "engine/sample/sampler.h"
#include "engine/sched/llm_engine.h"
#include "tests/unit/ranked_model.h"

namespace sluice {
namespace {

EngineRequest Request(const std::string& id, int salt, int max_tokens) {
  EngineRequest r;
  r.request_id = id;
  for (int i = 0; i < 9; ++i) r.prompt_token_ids.push_back(2 + (i * 5 + salt * 11) % 60);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.logprobs = 0;  // the chosen token's logprob, as generate_bench asks
  return r;
}

struct GenerateRun {
  std::map<std::string, std::vector<SampledToken>> tokens;
  int full_steps = 0;
  int greedy_steps = 0;
};

// Runs `requests` to completion (all admitted at once, so they share every step).
GenerateRun Generate(bool device_greedy, const std::vector<EngineRequest>& requests) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 256;
  auto model = std::make_unique<RankedModel>(device_greedy);
  RankedModel* m = model.get();
  auto engine = LLMEngine::Create(std::move(model), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  GenerateRun run;
  if (!engine.ok()) return run;
  for (const EngineRequest& r : requests) EXPECT_TRUE((*engine)->AddRequest(r).ok());
  for (int i = 0; i < 1000 && (*engine)->HasUnfinishedRequests(); ++i) {
    for (RequestOutput& out : (*engine)->Step()) {
      for (SampledToken& t : out.new_tokens) run.tokens[out.request_id].push_back(std::move(t));
    }
  }
  EXPECT_FALSE((*engine)->HasUnfinishedRequests());
  run.full_steps = m->full_steps();
  run.greedy_steps = m->greedy_steps();
  return run;
}

// The device run's tokens, logprobs and top logprobs equal the host run's.
void ExpectSameOutputs(const GenerateRun& host, const GenerateRun& device) {
  ASSERT_EQ(host.tokens.size(), device.tokens.size());
  for (const auto& [id, want] : host.tokens) {
    const std::vector<SampledToken>& got = device.tokens.at(id);
    ASSERT_EQ(got.size(), want.size()) << id;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].token_id, want[i].token_id) << id << " token " << i;
      EXPECT_NEAR(got[i].logprob, want[i].logprob, 1e-6) << id << " token " << i;
      ASSERT_EQ(got[i].top_logprobs.size(), want[i].top_logprobs.size()) << id << " " << i;
    }
  }
}

TEST(DeviceGreedyTest, AllGreedyStepsUseForwardGreedy) {
  const std::vector<EngineRequest> requests = {Request("a", 0, 12), Request("b", 1, 7),
                                               Request("c", 2, 20)};
  const GenerateRun host = Generate(false, requests);
  const GenerateRun device = Generate(true, requests);
  ExpectSameOutputs(host, device);
  EXPECT_EQ(host.greedy_steps, 0);
  EXPECT_GT(host.full_steps, 0);
  EXPECT_EQ(device.full_steps, 0);
  EXPECT_EQ(device.greedy_steps, host.full_steps);
  // The fake really exercises ties and EOS: some request stopped on EOS before max_tokens.
  bool stopped_early = false;
  for (const auto& [id, t] : host.tokens) {
    stopped_early = stopped_early || (t.back().token_id == RankedModel::kEos);
  }
  EXPECT_TRUE(stopped_early);
  // The logprob is the chosen token's log_softmax: < 0 with 64 competing ids.
  EXPECT_LT(host.tokens.at("c")[0].logprob, 0.0f);
}

// One request whose host sampling is more than an argmax of the raw logits makes every step it
// samples in fall back to Forward; the outputs stay those of host sampling.
TEST(DeviceGreedyTest, IneligibleRequestFallsBack) {
  struct Case {
    const char* name;
    void (*set)(SamplingParams&);
  };
  const Case cases[] = {
      {"temperature", [](SamplingParams& p) {
         p.temperature = 0.8f;
         p.seed = 7;
       }},
      {"top_logprobs", [](SamplingParams& p) { p.logprobs = 2; }},
      {"presence", [](SamplingParams& p) { p.presence_penalty = 0.5f; }},
      {"frequency", [](SamplingParams& p) { p.frequency_penalty = 0.5f; }},
      {"repetition", [](SamplingParams& p) { p.repetition_penalty = 1.3f; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EngineRequest special = Request("x", 3, 10);
    special.sampling.ignore_eos = true;  // keeps it in every step until max_tokens
    c.set(special.sampling);
    // "a" ends with or before "x" (max_tokens 10 vs 10), so every sampling step includes x.
    const std::vector<EngineRequest> requests = {Request("a", 0, 10), special};
    const GenerateRun host = Generate(false, requests);
    const GenerateRun device = Generate(true, requests);
    ExpectSameOutputs(host, device);
    EXPECT_EQ(device.greedy_steps, 0);
    EXPECT_EQ(device.full_steps, host.full_steps);
    EXPECT_EQ(host.tokens.at("x").size(), 10u);
  }
}

// min_tokens suppression only blocks the device path while it is active: the first min_tokens
// sampling steps fall back (EOS masked on the host), the later ones use ForwardGreedy.
TEST(DeviceGreedyTest, MinTokensFallsBackOnlyWhileSuppressing) {
  EngineRequest r = Request("m", 4, 12);
  r.sampling.min_tokens = 5;
  const GenerateRun host = Generate(false, {r});
  const GenerateRun device = Generate(true, {r});
  ExpectSameOutputs(host, device);
  ASSERT_GE(host.tokens.at("m").size(), 5u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NE(host.tokens.at("m")[i].token_id, RankedModel::kEos);
  EXPECT_EQ(device.full_steps, 5);
  EXPECT_EQ(device.greedy_steps, static_cast<int>(host.tokens.at("m").size()) - 5);

  // With ignore_eos and no stop ids there is nothing to suppress: all steps on the device.
  r.sampling.ignore_eos = true;
  const GenerateRun host2 = Generate(false, {r});
  const GenerateRun device2 = Generate(true, {r});
  ExpectSameOutputs(host2, device2);
  EXPECT_EQ(device2.full_steps, 0);
  EXPECT_EQ(device2.greedy_steps, 12);
}

TEST(DeviceGreedyTest, IsPlainGreedyListsEveryLogitModifier) {
  const std::vector<int32_t> prompt = {5, 6}, out2 = {7, 8}, eos = {1};
  const SequenceContext ctx{prompt, out2, eos};
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_TRUE(IsPlainGreedy(p, ctx));
  p.logprobs = 0;
  EXPECT_TRUE(IsPlainGreedy(p, ctx));
  p.top_k = 3;  // ignored by greedy argmax
  p.top_p = 0.5f;
  p.min_p = 0.2f;
  EXPECT_TRUE(IsPlainGreedy(p, ctx));
  p.min_tokens = 2;  // already two outputs: nothing suppressed
  EXPECT_TRUE(IsPlainGreedy(p, ctx));
  SamplingParams q = p;
  q.min_tokens = 3;
  EXPECT_FALSE(IsPlainGreedy(q, ctx));
  EXPECT_TRUE(IsPlainGreedy(q, SequenceContext{prompt, out2, {}}));
  q = p;
  q.temperature = 0.5f;
  EXPECT_FALSE(IsPlainGreedy(q, ctx));
  q = p;
  q.logprobs = 1;
  EXPECT_FALSE(IsPlainGreedy(q, ctx));
  q = p;
  q.presence_penalty = -0.1f;
  EXPECT_FALSE(IsPlainGreedy(q, ctx));
  q = p;
  q.frequency_penalty = 0.1f;
  EXPECT_FALSE(IsPlainGreedy(q, ctx));
  q = p;
  q.repetition_penalty = 0.9f;
  EXPECT_FALSE(IsPlainGreedy(q, ctx));
}

}  // namespace
}  // namespace sluice
