// Logits-row limit (EngineOptions::max_num_logits, Model::max_num_logits): a backend with
// fixed-size logits buffers (the CUDA runners) refuses a step with more logits rows than it
// holds. A request with prompt_logprobs asks for one row per prompt position of its prefill
// chunk, so the scheduler cuts such chunks (and drafts) to the rows left: no step exceeds the
// limit, the request takes more steps, the requests beside it go on, and every token, logprob
// and prompt logprob is exactly what an engine without the limit gives.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/model.h"
#include "engine/sched/llm_engine.h"
#include "engine/sched/scheduler.h"
#include "engine/spec/drafter.h"
#include "tests/util/fake_models.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

using testing::ChecksumModel;

// Every step's logits-row count, shared with the test (the engine owns the model).
using RowLog = std::shared_ptr<std::vector<int64_t>>;

// RowLimitedModel: a ChecksumModel that reports `reported` as its max_num_logits and, with
// `refused_over` > 0, refuses any step asking for more rows, as the CUDA runners do
// (RunnerCore::Validate: InvalidArgument for the whole step).
class RowLimitedModel final : public Model {
 public:
  RowLimitedModel(int64_t reported, int64_t refused_over, RowLog rows)
      : reported_(reported), refused_over_(refused_over), rows_(std::move(rows)) {}
  const ModelConfig& config() const override { return inner_.config(); }
  KvCacheSpec kv_cache_spec() const override { return inner_.kv_cache_spec(); }
  int64_t WeightBytesPerToken() const override { return 0; }
  int64_t max_num_logits() const override { return reported_; }
  absl::Status Forward(const ForwardInput& in, KvCache& kv, absl::Span<float> logits) override {
    const int64_t n = static_cast<int64_t>(in.logits_indices.size());
    rows_->push_back(n);
    if (refused_over_ > 0 && n > refused_over_) {
      return absl::InvalidArgumentError(
          absl::StrCat("step of ", n, " logits rows exceeds the limit ", refused_over_));
    }
    return inner_.Forward(in, kv, logits);
  }

 private:
  ChecksumModel inner_;
  int64_t reported_;
  int64_t refused_over_;
  RowLog rows_;
};

// OracleDrafter proposes the ChecksumModel's own continuation (every draft is accepted).
class OracleDrafter final : public Drafter {
 public:
  std::string_view method() const override { return "oracle"; }
  absl::Status Propose(absl::Span<const DraftInput> inputs, const DraftContinue& keep_going,
                       std::vector<DraftOutput>* outputs) override {
    outputs->assign(inputs.size(), DraftOutput{});
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::vector<int32_t> next = ChecksumModel::Reference(
          std::vector<int32_t>(inputs[i].token_ids.begin(), inputs[i].token_ids.end()),
          inputs[i].max_draft_tokens);
      for (int32_t j = 0; j < static_cast<int32_t>(next.size()); ++j) {
        (*outputs)[i].tokens.push_back(next[j]);
        (*outputs)[i].confidence.push_back(1.0f);
        if (keep_going && !keep_going(i, j, 1.0f)) break;
      }
    }
    return absl::OkStatus();
  }
};

std::vector<int32_t> Prompt(int len, int salt, int32_t vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(3 + (i * 7 + salt * 13) % (vocab - 3));
  return p;
}

EngineRequest Request(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

struct Arrival {
  int step = 0;
  EngineRequest request;
};

struct Result {
  std::vector<SampledToken> tokens;
  std::vector<PromptLogprob> prompt_logprobs;
  int num_prompt_logprob_outputs = 0;
  FinishReason finish = FinishReason::kNone;
  absl::Status status;
};

struct EngineRun {
  std::map<std::string, Result> results;
  int64_t steps = 0;
  EngineCounters counters;
};

// RunArrivals adds each request at its step and steps until every request finished.
EngineRun RunArrivals(LLMEngine& engine, const std::vector<Arrival>& arrivals) {
  EngineRun run;
  size_t added = 0;
  for (int step = 0; step < 2000; ++step) {
    for (const Arrival& a : arrivals) {
      if (a.step == step) {
        EXPECT_TRUE(engine.AddRequest(a.request).ok()) << a.request.request_id;
        ++added;
      }
    }
    if (added == arrivals.size() && !engine.HasUnfinishedRequests()) break;
    for (RequestOutput& out : engine.Step()) {
      Result& r = run.results[out.request_id];
      for (SampledToken& t : out.new_tokens) r.tokens.push_back(std::move(t));
      if (!out.prompt_logprobs.empty()) {
        ++r.num_prompt_logprob_outputs;
        r.prompt_logprobs = std::move(out.prompt_logprobs);
      }
      if (out.finished()) {
        r.finish = out.finish_reason;
        r.status = out.status;
      }
    }
    ++run.steps;
  }
  EXPECT_FALSE(engine.HasUnfinishedRequests());
  run.counters = engine.counters();
  return run;
}

void ExpectSameTop(const std::vector<TokenLogprob>& got, const std::vector<TokenLogprob>& want,
                   const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(got[k].token_id, want[k].token_id) << where << " top " << k;
    EXPECT_EQ(got[k].logprob, want[k].logprob) << where << " top " << k;  // bit for bit
  }
}

// ExpectSameResults: every request finished alike, with the same tokens, logprobs and prompt
// logprobs, bit for bit.
void ExpectSameResults(const EngineRun& got, const EngineRun& want) {
  ASSERT_EQ(got.results.size(), want.results.size());
  for (const auto& [id, w] : want.results) {
    auto it = got.results.find(id);
    ASSERT_NE(it, got.results.end()) << id;
    const Result& g = it->second;
    EXPECT_TRUE(g.status.ok()) << id << ": " << g.status;
    EXPECT_EQ(g.finish, w.finish) << id;
    ASSERT_EQ(g.tokens.size(), w.tokens.size()) << id;
    for (size_t t = 0; t < w.tokens.size(); ++t) {
      const std::string where = absl::StrCat(id, " token ", t);
      EXPECT_EQ(g.tokens[t].token_id, w.tokens[t].token_id) << where;
      EXPECT_EQ(g.tokens[t].logprob, w.tokens[t].logprob) << where;
      ExpectSameTop(g.tokens[t].top_logprobs, w.tokens[t].top_logprobs, where);
    }
    EXPECT_EQ(g.num_prompt_logprob_outputs, w.num_prompt_logprob_outputs) << id;
    ASSERT_EQ(g.prompt_logprobs.size(), w.prompt_logprobs.size()) << id;
    for (size_t p = 0; p < w.prompt_logprobs.size(); ++p) {
      const std::string where = absl::StrCat(id, " prompt position ", p + 1);
      const PromptLogprob& a = g.prompt_logprobs[p];
      const PromptLogprob& b = w.prompt_logprobs[p];
      EXPECT_EQ(a.token_id, b.token_id) << where;
      EXPECT_EQ(a.logprob, b.logprob) << where;
      EXPECT_EQ(a.rank, b.rank) << where;
      ExpectSameTop(a.top_logprobs, b.top_logprobs, where);
    }
  }
}

constexpr int64_t kVocab = ChecksumModel::kVocab;
constexpr int32_t kMaxSeqs = 4;
constexpr int64_t kRowLimit = 4;  // = kMaxSeqs: what a CUDA runner without speculation holds
constexpr int kLongPrompt = 60;   // > kMaxSeqs: one unlimited chunk asks for 60 rows

// Two requests decoding, then a long prompt with prompt logprobs beside them, a short one
// with top logprobs, a second prompt-logprob request and a sampled one (the fifth waits for a
// free slot).
std::vector<Arrival> MixedArrivals() {
  std::vector<Arrival> a;
  a.push_back({0, Request("decode-a", Prompt(5, 1, kVocab), 24)});
  EngineRequest sampled = Request("decode-b", Prompt(7, 2, kVocab), 20);
  sampled.sampling.temperature = 0.9f;
  sampled.sampling.seed = 7;
  a.push_back({0, sampled});
  EngineRequest long_prompt = Request("long", Prompt(kLongPrompt, 3, kVocab), 4);
  long_prompt.sampling.prompt_logprobs = 3;
  a.push_back({2, long_prompt});
  EngineRequest top = Request("short", Prompt(6, 4, kVocab), 10);
  top.sampling.logprobs = 2;
  a.push_back({3, top});
  EngineRequest second = Request("long-2", Prompt(33, 5, kVocab), 3);
  second.sampling.prompt_logprobs = 0;
  a.push_back({3, second});
  return a;
}

EngineOptions ChecksumOptions(SchedulingPolicy policy) {
  EngineOptions o;
  o.block_size = 4;
  o.num_kv_blocks = 256;
  o.max_num_seqs = kMaxSeqs;
  o.max_num_batched_tokens = 64;
  o.enable_prefix_caching = true;
  o.scheduling_policy = policy;
  return o;
}

EngineRun RunChecksum(const EngineOptions& options, int64_t reported, int64_t refused_over,
                const RowLog& rows, const std::vector<Arrival>& arrivals) {
  auto engine = LLMEngine::Create(std::make_unique<RowLimitedModel>(reported, refused_over, rows),
                                  options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  return RunArrivals(**engine, arrivals);
}

int64_t MaxRows(const RowLog& rows) {
  return rows->empty() ? 0 : *std::max_element(rows->begin(), rows->end());
}

class LogitsRowLimitTest : public ::testing::TestWithParam<SchedulingPolicy> {};

// The limit given as an engine option (a CPU model has none of its own).
TEST_P(LogitsRowLimitTest, OptionLimitKeepsEveryStepWithinItAndChangesNoOutput) {
  const std::vector<Arrival> arrivals = MixedArrivals();
  auto free_rows = std::make_shared<std::vector<int64_t>>();
  const EngineRun unlimited = RunChecksum(ChecksumOptions(GetParam()), 0, 0, free_rows, arrivals);
  // Without a limit the long prompt's chunk alone asks for its 60 positions' rows.
  EXPECT_GE(MaxRows(free_rows), kLongPrompt);

  EngineOptions options = ChecksumOptions(GetParam());
  options.max_num_logits = kRowLimit;
  auto rows = std::make_shared<std::vector<int64_t>>();
  const EngineRun limited = RunChecksum(options, 0, kRowLimit, rows, arrivals);
  EXPECT_EQ(MaxRows(rows), kRowLimit);  // within the limit, and using all of it
  EXPECT_GT(limited.steps, unlimited.steps);  // the prompt-logprob requests took more steps
  ExpectSameResults(limited, unlimited);
  // The reference values themselves: every prompt position scored, the tokens the model's.
  const Result& long_result = limited.results.at("long");
  EXPECT_EQ(long_result.finish, FinishReason::kLength);
  EXPECT_EQ(long_result.prompt_logprobs.size(), static_cast<size_t>(kLongPrompt - 1));
  std::vector<int32_t> ids;
  for (const SampledToken& t : long_result.tokens) ids.push_back(t.token_id);
  EXPECT_EQ(ids, ChecksumModel::Reference(Prompt(kLongPrompt, 3, kVocab), 4));
}

// The limit reported by the model (as the CUDA runners report their logits buffers' rows): a
// prompt-logprob request whose prompt is longer than max_num_seqs succeeds beside the others
// instead of failing every request of its step.
TEST_P(LogitsRowLimitTest, ModelLimitLetsALongPromptLogprobsRequestRunBesideOthers) {
  const std::vector<Arrival> arrivals = MixedArrivals();
  auto free_rows = std::make_shared<std::vector<int64_t>>();
  const EngineRun unlimited = RunChecksum(ChecksumOptions(GetParam()), 0, 0, free_rows, arrivals);

  auto rows = std::make_shared<std::vector<int64_t>>();
  const EngineRun limited =
      RunChecksum(ChecksumOptions(GetParam()), kRowLimit, kRowLimit, rows, arrivals);
  EXPECT_LE(MaxRows(rows), kRowLimit);
  for (const auto& [id, r] : limited.results) {
    EXPECT_TRUE(r.status.ok()) << id << ": " << r.status;
    EXPECT_NE(r.finish, FinishReason::kError) << id;
  }
  ExpectSameResults(limited, unlimited);
}

INSTANTIATE_TEST_SUITE_P(Policies, LogitsRowLimitTest,
                         ::testing::Values(SchedulingPolicy::kFcfs, SchedulingPolicy::kPriority,
                                           SchedulingPolicy::kShortestPrefillFirst));

TEST(LogitsRowLimitEngineTest, RefusesALimitBelowMaxNumSeqs) {
  auto rows = std::make_shared<std::vector<int64_t>>();
  EngineOptions options = ChecksumOptions(SchedulingPolicy::kFcfs);
  options.max_num_logits = kMaxSeqs - 1;
  auto engine = LLMEngine::Create(std::make_unique<RowLimitedModel>(0, 0, rows), options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("max_num_seqs 4"), std::string::npos)
      << engine.status();
  // The model's own limit counts too (a runner built for fewer sequences than the engine's).
  options.max_num_logits = 0;
  engine = LLMEngine::Create(std::make_unique<RowLimitedModel>(2, 2, rows), options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("the model's max_num_logits"), std::string::npos)
      << engine.status();
  // With both, the smaller holds.
  options.max_num_logits = 100;
  engine = LLMEngine::Create(std::make_unique<RowLimitedModel>(kMaxSeqs, kMaxSeqs, rows),
                             options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->AddRequest(Request("a", Prompt(30, 1, kVocab), 2)).ok());
  EngineRequest scored = Request("b", Prompt(30, 2, kVocab), 2);
  scored.sampling.prompt_logprobs = 1;
  ASSERT_TRUE((*engine)->AddRequest(scored).ok());
  for (int i = 0; i < 100 && (*engine)->HasUnfinishedRequests(); ++i) {
    for (const RequestOutput& out : (*engine)->Step()) EXPECT_TRUE(out.status.ok()) << out.status;
  }
  EXPECT_FALSE((*engine)->HasUnfinishedRequests());
  EXPECT_LE(MaxRows(rows), kMaxSeqs);
}

// Speculative decoding: verify rows (drafts + bonus) count against the limit too; drafts are
// cut so that every decode keeps its row, and the prompt-logprob request still progresses.
TEST(LogitsRowLimitEngineTest, DraftsAreCutToTheRowsLeft) {
  std::vector<Arrival> arrivals;
  arrivals.push_back({0, Request("decode-a", Prompt(5, 1, kVocab), 30)});
  arrivals.push_back({0, Request("decode-b", Prompt(9, 2, kVocab), 30)});
  EngineRequest long_prompt = Request("long", Prompt(40, 3, kVocab), 6);
  long_prompt.sampling.prompt_logprobs = 2;
  arrivals.push_back({3, long_prompt});

  EngineOptions base = ChecksumOptions(SchedulingPolicy::kFcfs);
  base.max_num_seqs = 3;
  auto plain_rows = std::make_shared<std::vector<int64_t>>();
  const EngineRun plain = RunChecksum(base, 0, 0, plain_rows, arrivals);  // no drafts, no limit

  EngineOptions options = base;
  options.max_num_logits = 4;
  options.speculative.drafter = std::make_shared<OracleDrafter>();
  options.speculative.num_speculative_tokens = 4;
  options.speculative.verify = VerifyMode::kFixed;
  auto rows = std::make_shared<std::vector<int64_t>>();
  const EngineRun limited = RunChecksum(options, 0, 4, rows, arrivals);
  EXPECT_LE(MaxRows(rows), 4);
  EXPECT_GT(limited.counters.num_spec_draft_tokens, 0);
  EXPECT_EQ(limited.counters.num_spec_accepted_tokens, limited.counters.num_spec_draft_tokens);
  EXPECT_LT(limited.steps, plain.steps);  // drafting still pays within the limit
  ExpectSameResults(limited, plain);
  for (const auto& [id, r] : limited.results) {
    std::vector<int32_t> ids;
    for (const SampledToken& t : r.tokens) ids.push_back(t.token_id);
    const std::vector<int32_t>& prompt =
        std::find_if(arrivals.begin(), arrivals.end(), [&](const Arrival& a) {
          return a.request.request_id == id;
        })->request.prompt_token_ids;
    EXPECT_EQ(ids, ChecksumModel::Reference(prompt, static_cast<int>(ids.size()))) << id;
  }
}

// A real model (llama-tiny, whose CPU forward is batch invariant): prompt logprobs with top
// alternatives, top logprobs and a seeded sampled request are bit for bit those of an engine
// without the limit.
TEST(LogitsRowLimitEngineTest, LlamaPromptLogprobsAreBitIdenticalUnderTheLimit) {
  const std::string dir = sluice::testing::FixtureDir("llama-tiny");
  const int32_t vocab = 8192;
  std::vector<Arrival> arrivals;
  EngineRequest greedy = Request("greedy", Prompt(8, 1, vocab), 12);
  greedy.sampling.logprobs = 3;
  arrivals.push_back({0, greedy});
  EngineRequest sampled = Request("sampled", Prompt(10, 2, vocab), 12);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.seed = 99;
  arrivals.push_back({0, sampled});
  EngineRequest scored = Request("scored", Prompt(50, 3, vocab), 3);
  scored.sampling.prompt_logprobs = 5;
  arrivals.push_back({1, scored});

  auto run = [&](int64_t max_num_logits) {
    auto model = LoadModel(dir);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return EngineRun{};
    EngineOptions o;
    o.block_size = 4;
    o.num_kv_blocks = 128;
    o.max_model_len = 128;
    o.max_num_seqs = 3;
    o.max_num_batched_tokens = 32;
    o.max_num_logits = max_num_logits;
    o.batch_invariant = true;
    auto engine = LLMEngine::Create(*std::move(model), o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return EngineRun{};
    return RunArrivals(**engine, arrivals);
  };
  const EngineRun unlimited = run(0);
  const EngineRun limited = run(3);
  EXPECT_GT(limited.steps, unlimited.steps);
  ASSERT_EQ(limited.results.at("scored").prompt_logprobs.size(), 49u);
  ExpectSameResults(limited, unlimited);
}

// NumLogitsRows / FitLogitsRows count what the engine's forward input asks for.
TEST(LogitsRowLimitSchedulerTest, CountsPromptAndSampleRows) {
  Sequence seq;
  seq.request.prompt_token_ids = Prompt(10, 1, kVocab);
  seq.token_ids = seq.request.prompt_token_ids;
  seq.request.sampling.prompt_logprobs = 1;
  EXPECT_EQ(NumLogitsRows(seq, 4), 4);    // positions 0..3 score tokens 1..4
  EXPECT_EQ(NumLogitsRows(seq, 9), 9);    // positions 0..8: no sample yet
  EXPECT_EQ(NumLogitsRows(seq, 10), 10);  // 9 prompt rows and the sample row
  EXPECT_EQ(FitLogitsRows(seq, 10, 6), 6);
  EXPECT_EQ(FitLogitsRows(seq, 10, 0), 0);
  EXPECT_EQ(FitLogitsRows(seq, 3, 6), 3);
  seq.num_computed_tokens = 8;
  EXPECT_EQ(NumLogitsRows(seq, 2), 2);  // position 8's row and the sample row
  seq.request.sampling.prompt_logprobs.reset();
  EXPECT_EQ(NumLogitsRows(seq, 1), 0);  // a chunk that does not reach the end: no row
  EXPECT_EQ(NumLogitsRows(seq, 2), 1);
  EXPECT_EQ(FitLogitsRows(seq, 2, 0), 1);  // stops short of sampling
  // A decode with three drafts: its token's row and one per draft.
  seq.num_computed_tokens = 9;
  EXPECT_EQ(NumLogitsRows(seq, 4), 4);
  EXPECT_EQ(FitLogitsRows(seq, 4, 2), 2);
  EXPECT_EQ(FitLogitsRows(seq, 4, 0), 0);
}

}  // namespace
}  // namespace sluice
