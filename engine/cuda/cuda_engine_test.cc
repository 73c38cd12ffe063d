// LLMEngine over the CUDA runners (GPU only; part of cuda_model_test): async scheduling
// (EngineOptions::async_scheduling, Model::EnqueueSampledStep) against the synchronous engine
// on the same GPU model, and the fixtures' golden greedy continuations through the engine.
// With ignore_eos every step of both engines runs the same batch, so the same kernels run on
// the same inputs and the tokens must be identical.
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda/cuda_model.h"
#include "engine/grammar/grammar_compiler.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/token_vocab.h"
#include "engine/model/model_config.h"
#include "engine/sched/llm_engine.h"
#include "gtest/gtest.h"
#include "kernels/attention/paged_attention_cuda.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/linear/linear_cuda.h"
#include "kernels/mla_attention/mla_attention_cuda.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_prefill_gemm_cuda.h"
#include "tests/util/golden_runner.h"
#include "tests/util/test_paths.h"

namespace sluice::cuda_runner {
namespace {

CudaRunnerOptions EngineRunnerOptions() {
  CudaRunnerOptions o;
  o.block_size = 16;
  o.max_model_len = 512;
  o.max_num_tokens = 512;
  // testing::RunGreedy asks for every prompt position's logits: up to 150 rows in a step.
  o.max_num_seqs = 256;
  o.graph_batch_sizes = {1, 2, 4, 8, 16, 32, 64};
  // The tests compare tokens of two runner instances (the engine's and the model's own greedy)
  // for equality: timed GEMM tuning may give them different split-K shapes, whose sums round
  // differently and flip near-tied greedy tokens (seen on sluice-mini-moe, H200), so both keep
  // cuBLASLt's heuristic plans.
  o.autotune_gemms = false;
  return o;
}

struct EngineRun {
  std::map<std::string, std::vector<SampledToken>> tokens;
  std::map<std::string, FinishReason> finish;
  int64_t steps = 0;
};

// Runs `requests` (added two per step) to completion on a fresh engine over `dir`.
EngineRun RunEngine(const std::string& dir, bool async, const std::vector<EngineRequest>& requests,
                    int64_t num_kv_blocks = 256) {
  EngineRun run;
  auto model = LoadCudaModel(dir, EngineRunnerOptions());
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return run;
  EngineOptions options;
  options.block_size = 16;
  options.num_kv_blocks = num_kv_blocks;
  options.allocate_host_kv_cache = false;
  options.max_model_len = 512;
  options.max_num_seqs = 64;
  options.async_scheduling = async;
  auto engine = LLMEngine::Create(std::move(*model), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return run;
  size_t next = 0;
  for (int step = 0; step < 5000; ++step) {
    for (int k = 0; k < 2 && next < requests.size(); ++k) {
      EXPECT_TRUE((*engine)->AddRequest(requests[next++]).ok());
    }
    if (next == requests.size() && !(*engine)->HasStepWork()) break;
    for (RequestOutput& out : (*engine)->Step()) {
      EXPECT_TRUE(out.status.ok()) << out.request_id << ": " << out.status;
      for (SampledToken& t : out.new_tokens) run.tokens[out.request_id].push_back(std::move(t));
      if (out.finished()) run.finish[out.request_id] = out.finish_reason;
    }
  }
  EXPECT_FALSE((*engine)->HasUnfinishedRequests());
  EXPECT_EQ((*engine)->num_free_blocks(), (*engine)->num_total_blocks());
  run.steps = (*engine)->counters().num_steps;
  return run;
}

std::vector<EngineRequest> Requests(int n, int32_t vocab, bool ignore_eos) {
  std::vector<EngineRequest> out;
  for (int i = 0; i < n; ++i) {
    EngineRequest r;
    r.request_id = "r" + std::to_string(i);
    for (int t = 0; t < 5 + (i * 7) % 23; ++t) {
      r.prompt_token_ids.push_back(1 + (t * 131 + i * 977) % (vocab - 1));
    }
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 8 + (i * 5) % 17;
    r.sampling.ignore_eos = ignore_eos;
    r.sampling.logprobs = 0;
    out.push_back(std::move(r));
  }
  return out;
}

void ExpectSameTokens(const EngineRun& sync, const EngineRun& async) {
  ASSERT_EQ(sync.tokens.size(), async.tokens.size());
  for (const auto& [id, want] : sync.tokens) {
    const std::vector<SampledToken>& got = async.tokens.at(id);
    ASSERT_EQ(got.size(), want.size()) << id;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].token_id, want[i].token_id) << id << " token " << i;
      // Device fp32 log-sum-exp vs the host's double one over the same bf16 logits.
      EXPECT_NEAR(got[i].logprob, want[i].logprob, 1e-4) << id << " token " << i;
    }
  }
  EXPECT_EQ(sync.finish, async.finish);
}

class CudaEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  }
  // The parameter's model folder: a fixture, or a trained model of ../shared/models.
  std::string Dir() const {
    return GetParam() == "sluice-mini-moe" ? testing::SharedModelDir(GetParam())
                                           : testing::FixtureDir(GetParam());
  }
};

TEST_P(CudaEngineTest, AsyncSchedulingEqualsSynchronous) {
  const std::string dir = Dir();
  auto config = ModelConfig::Load(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  const int32_t vocab = static_cast<int32_t>(config->vocab_size);
  const std::vector<EngineRequest> requests = Requests(24, vocab, /*ignore_eos=*/true);
  const EngineRun sync = RunEngine(dir, false, requests);
  const EngineRun async = RunEngine(dir, true, requests);
  ExpectSameTokens(sync, async);
  EXPECT_EQ(sync.steps, async.steps);
  // A KV cache of 48 blocks of 16 tokens for 24 requests of up to ~50 tokens: preemptions.
  const EngineRun sync_small = RunEngine(dir, false, requests, 48);
  const EngineRun async_small = RunEngine(dir, true, requests, 48);
  ExpectSameTokens(sync_small, async_small);
}

// Seeded temperature / top-k / top-p / min-p requests: sampled on the GPU by the async engine
// (SampleRowsCuda with each request's draw) and on the host from the same bf16 logits by the
// synchronous one — the same tokens (they could differ only for a draw within ~1e-10 of a
// CDF boundary).
TEST_P(CudaEngineTest, DeviceSamplingEqualsHostSampling) {
  const std::string dir = Dir();
  auto config = ModelConfig::Load(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  const int32_t vocab = static_cast<int32_t>(config->vocab_size);
  std::vector<EngineRequest> requests = Requests(16, vocab, /*ignore_eos=*/true);
  for (size_t i = 0; i < requests.size(); ++i) {
    SamplingParams& p = requests[i].sampling;
    p.temperature = 0.6f + 0.2f * static_cast<float>(i % 4);
    p.seed = 77 + static_cast<int64_t>(i);
    if (i % 4 == 1) p.top_k = 20;
    if (i % 4 == 2) p.top_p = 0.8f;
    if (i % 4 == 3) p.min_p = 0.05f;
  }
  const EngineRun sync = RunEngine(dir, false, requests);
  const EngineRun async = RunEngine(dir, true, requests);
  ExpectSameTokens(sync, async);
}

// Penalties, min_tokens suppression and top logprobs: the async engine processes the logits on
// the GPU (Model::EnqueueProcessedSampledStep: LogitsProcessingCuda, the fp32 SampleRowsCuda,
// LogprobRowsCuda) with the placeholder of the step in flight as the newest output id; the
// synchronous one runs SampleToken on the host over the same bf16 logits. Same tokens, logprobs
// within 1e-4, same top-logprob ids. The stop ids of the min_tokens rows are their own first
// unsuppressed tokens, so the suppression changes what they generate; min_tokens = max_tokens
// keeps it on to the end, so every request ends by length and both engines run the same
// batches (a stop finish would leave the async engine one wasted row, a different batch).
TEST_P(CudaEngineTest, DeviceLogitsProcessingEqualsHost) {
  const std::string dir = Dir();
  auto config = ModelConfig::Load(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  const int32_t vocab = static_cast<int32_t>(config->vocab_size);
  std::vector<EngineRequest> requests = Requests(20, vocab, /*ignore_eos=*/true);
  for (size_t i = 0; i < requests.size(); ++i) {
    SamplingParams& p = requests[i].sampling;
    p.max_tokens = 12 + static_cast<int32_t>(i % 9);
    p.seed = 300 + static_cast<int64_t>(i);
    switch (i % 5) {
      case 0:  // greedy, repetition (CTRL) penalty, top 5
        p.repetition_penalty = 1.3f;
        p.logprobs = 5;
        break;
      case 1:  // sampled, frequency + presence, top_k
        p.temperature = 0.8f;
        p.top_k = 20;
        p.frequency_penalty = 0.5f;
        p.presence_penalty = 0.3f;
        break;
      case 2:  // greedy at the API limits, top 20, min_tokens
        p.frequency_penalty = 2.0f;
        p.presence_penalty = -2.0f;
        p.logprobs = 20;
        p.min_tokens = p.max_tokens;
        break;
      case 3:  // sampled, top_p, repetition < 1, top 1, min_tokens
        p.temperature = 1.0f;
        p.top_p = 0.9f;
        p.repetition_penalty = 0.8f;
        p.logprobs = 1;
        p.min_tokens = p.max_tokens;
        break;
      default:  // no processing (mixed into processed steps)
        break;
    }
  }
  // Stop ids for the min_tokens rows: their first tokens without suppression.
  const EngineRun plain = RunEngine(dir, false, requests);
  for (EngineRequest& r : requests) {
    if (r.sampling.min_tokens == 0) continue;
    const std::vector<SampledToken>& first = plain.tokens.at(r.request_id);
    ASSERT_FALSE(first.empty());
    r.sampling.stop_token_ids = {first[0].token_id, first[1].token_id};
  }
  const EngineRun sync = RunEngine(dir, false, requests);
  const EngineRun async = RunEngine(dir, true, requests);
  ExpectSameTokens(sync, async);
  EXPECT_EQ(sync.steps, async.steps);
  int64_t top_entries = 0;
  for (const auto& [id, want] : sync.tokens) {
    const std::vector<SampledToken>& got = async.tokens.at(id);
    for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
      ASSERT_EQ(got[i].top_logprobs.size(), want[i].top_logprobs.size()) << id << " " << i;
      for (size_t j = 0; j < want[i].top_logprobs.size(); ++j) {
        EXPECT_EQ(got[i].top_logprobs[j].token_id, want[i].top_logprobs[j].token_id)
            << id << " token " << i << " entry " << j;
        EXPECT_NEAR(got[i].top_logprobs[j].logprob, want[i].top_logprobs[j].logprob, 1e-4)
            << id << " token " << i << " entry " << j;
        ++top_entries;
      }
    }
  }
  EXPECT_GT(top_entries, 0);
  // Suppression did act: no min_tokens row generates a stop id, and the first token differs
  // from the unsuppressed run's.
  for (const EngineRequest& r : requests) {
    if (r.sampling.min_tokens == 0) continue;
    const std::vector<SampledToken>& got = sync.tokens.at(r.request_id);
    ASSERT_EQ(got.size(), static_cast<size_t>(r.sampling.max_tokens)) << r.request_id;
    EXPECT_NE(got[0].token_id, plain.tokens.at(r.request_id)[0].token_id) << r.request_id;
    for (const SampledToken& t : got) {
      EXPECT_NE(t.token_id, r.sampling.stop_token_ids[0]) << r.request_id;
      EXPECT_NE(t.token_id, r.sampling.stop_token_ids[1]) << r.request_id;
    }
  }
  // With a small KV cache: preemptions recompute sequences with penalties in flight.
  ExpectSameTokens(RunEngine(dir, false, requests, 48), RunEngine(dir, true, requests, 48));
}

// Grammar rows through the async engine: with a step in flight, a plan's forward is enqueued
// first and its masks are built once that step is read (Model::EnqueueForwardStep, then
// EnqueueStepSampling). Tokens, logprobs and finish reasons equal the synchronous engine's
// (host masking and sampling), and every output follows the grammar.
TEST_P(CudaEngineTest, GrammarMasksBuiltWhileTheForwardRunsEqualHost) {
  const std::string dir = Dir();
  auto config = ModelConfig::Load(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  const int32_t vocab = static_cast<int32_t>(config->vocab_size);
  // Token i spells i in decimal with the letters a-j ("bcd" is 123); the EOS spells nothing.
  std::vector<std::string> texts(vocab);
  for (int32_t i = 0; i < vocab; ++i) {
    for (char c : std::to_string(i)) texts[i] += static_cast<char>('a' + (c - '0'));
  }
  const std::vector<int32_t> eos = config->eos_token_ids;
  for (int32_t id : eos) texts[id].clear();
  grammar::GrammarCompiler compiler(grammar::TokenVocab::FromTokens(texts, eos));
  // No output of at most 16 tokens (5 letters each at most) ends it, and ignore_eos keeps the
  // others running: both engines step the same batches, so MoE routing sees the same rows.
  auto regex = compiler.Compile({grammar::GrammarKind::kRegex, "b[a-j]{100}", {}});
  ASSERT_TRUE(regex.ok()) << regex.status();
  std::vector<EngineRequest> requests = Requests(24, vocab, /*ignore_eos=*/true);
  for (size_t i = 0; i < requests.size(); ++i) {
    SamplingParams& p = requests[i].sampling;
    p.max_tokens = 10 + static_cast<int32_t>(i % 7);
    p.seed = 500 + static_cast<int64_t>(i);
    if (i % 3 == 1) p.temperature = 0.9f;
    if (i % 2 == 0) requests[i].grammar = *regex;  // the others share the steps unconstrained
  }
  const EngineRun sync = RunEngine(dir, false, requests);
  const EngineRun async = RunEngine(dir, true, requests);
  ExpectSameTokens(sync, async);
  EXPECT_EQ(sync.steps, async.steps);
  int constrained = 0;
  for (const EngineRequest& r : requests) {
    if (r.grammar == nullptr) continue;
    grammar::GrammarMatcher m(r.grammar, eos);
    const std::vector<SampledToken>& got = async.tokens.at(r.request_id);
    EXPECT_EQ(got.size(), static_cast<size_t>(r.sampling.max_tokens)) << r.request_id;
    for (const SampledToken& t : got) {
      EXPECT_TRUE(m.AcceptToken(t.token_id)) << r.request_id << " token " << t.token_id;
    }
    ++constrained;
  }
  EXPECT_EQ(constrained, 12);
}

// The golden prompts through the async engine (alone in the batch, stop ids ignored) give the
// greedy tokens of the same GPU model driven step by step without the engine
// (testing::RunGreedy: Forward, logits to the host, host argmax) — same kernels, so equal token
// for token. (The fixtures' own greedy continuations are fp32 references: the bf16 model may
// part from them at near-ties, which CudaModelTest judges by top-1 instead.)
TEST_P(CudaEngineTest, GoldenPromptsThroughAsyncEngineEqualModelGreedy) {
  const std::string dir = Dir();
  auto cases = testing::LoadGoldenCases(dir + "/golden.safetensors");
  ASSERT_TRUE(cases.ok()) << cases.status();
  auto model = LoadCudaModel(dir, EngineRunnerOptions());
  ASSERT_TRUE(model.ok()) << model.status();
  for (size_t c = 0; c < cases->size(); ++c) {
    const testing::GoldenCase& g = (*cases)[c];
    testing::GoldenRunOptions opt;
    opt.block_size = 16;
    opt.num_new_tokens = static_cast<int64_t>(g.greedy.size());
    auto want = testing::RunGreedy(**model, g.input_ids, opt);
    ASSERT_TRUE(want.ok()) << want.status();
    EngineRequest r;
    r.request_id = "golden";
    r.prompt_token_ids = g.input_ids;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = static_cast<int32_t>(g.greedy.size());
    r.sampling.ignore_eos = true;
    const EngineRun run = RunEngine(dir, true, {r});
    ASSERT_EQ(run.tokens.at("golden").size(), want->greedy.size()) << "case " << c;
    int64_t golden_agree = 0;
    for (size_t i = 0; i < want->greedy.size(); ++i) {
      EXPECT_EQ(run.tokens.at("golden")[i].token_id, want->greedy[i]) << "case " << c << " " << i;
      golden_agree += run.tokens.at("golden")[i].token_id == g.greedy[i];
    }
    std::printf("%s case %zu: %lld of %zu tokens equal the fp32 golden continuation\n",
                GetParam().c_str(), c, static_cast<long long>(golden_agree), g.greedy.size());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaEngineTest,
                         ::testing::Values("llama-tiny", "qwen3-hybrid-tiny", "deepseek-v3-tiny",
                                           "sluice-mini-moe"));

}  // namespace
}  // namespace sluice::cuda_runner
