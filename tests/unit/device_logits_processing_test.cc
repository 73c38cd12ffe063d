// The engine's device logits-processing path (Model::SupportsDeviceLogitsProcessing,
// EnqueueProcessedSampledStep, ReadSampledStepWithTop) without a GPU: HostAsyncModel runs the
// asynchronous-step protocol on the host with the kernels' CPU references (LogitsProcessingCpu
// resolving the placeholder ids from its previous step's tokens, SampleRowCpu, TopLogprobsCpu)
// — what the CUDA runner computes on the device. Async engines over it must give exactly the
// synchronous engine's tokens, logprobs and top logprobs (SampleToken on the host): this checks
// the lists, the placeholders, the per-request draws and the top-logprob delivery.
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "engine/grammar/grammar_compiler.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/model/model.h"
#include "engine/sample/sampler.h"
#include "engine/sched/llm_engine.h"
#include "kernels/sampling/logits_processing.h"
#include "kernels/sampling/sampling.h"
#include "tests/util/fake_models.h"

namespace sluice {
namespace {

using testing::ChecksumModel;

// ChecksumModel's one-hot logits plus a smooth position-dependent background, so penalties
// and draws have something to act on.
class HostAsyncModel final : public Model {
 public:
  // `deferred`: also the split protocol (EnqueueForwardStep, then EnqueueStepSampling).
  explicit HostAsyncModel(bool device_processing, bool deferred = false)
      : device_processing_(device_processing), deferred_(deferred) {}
  const ModelConfig& config() const override { return inner_.config(); }
  KvCacheSpec kv_cache_spec() const override { return inner_.kv_cache_spec(); }
  int64_t WeightBytesPerToken() const override { return 0; }
  absl::Status Forward(const ForwardInput& in, KvCache& kv, absl::Span<float> logits) override {
    if (absl::Status s = inner_.Forward(in, kv, logits); !s.ok()) return s;
    const int64_t vocab = ChecksumModel::kVocab;
    for (size_t r = 0; r < in.logits_indices.size(); ++r) {
      const int32_t pos = in.positions[in.logits_indices[r]];
      for (int64_t i = 0; i < vocab; ++i) {
        logits[r * vocab + i] += 3.0f * std::sin(0.7f * static_cast<float>(i) + 1.3f * pos);
      }
    }
    return absl::OkStatus();
  }

  bool SupportsAsyncSteps() const override { return true; }
  bool SupportsDeviceLogitsProcessing() const override { return device_processing_; }
  absl::Status EnqueueSampledStep(const ForwardInput& input, KvCache& kv,
                                  absl::Span<const kernels::SamplingRow> rows) override {
    ++plain_steps;
    return Enqueue(input, kv, rows, DeviceLogitsProcessing{});
  }
  absl::Status EnqueueProcessedSampledStep(const ForwardInput& input, KvCache& kv,
                                           absl::Span<const kernels::SamplingRow> rows,
                                           const DeviceLogitsProcessing& processing) override {
    if (!device_processing_) return Model::EnqueueProcessedSampledStep(input, kv, rows, processing);
    ++processed_steps;
    return Enqueue(input, kv, rows, processing);
  }
  bool SupportsDeferredSampling() const override { return deferred_; }
  absl::Status EnqueueForwardStep(const ForwardInput& input, KvCache& kv) override {
    if (!deferred_) return Model::EnqueueForwardStep(input, kv);
    if (pending_.has_value()) return absl::FailedPreconditionError("forward pending");
    ++deferred_steps;
    // The engine reads the step before while this forward "runs".
    if (!unread_.empty()) ++overlapped_forwards;
    return EnqueueForward(input, kv);
  }
  absl::Status EnqueueStepSampling(absl::Span<const kernels::SamplingRow> rows,
                                   const DeviceLogitsProcessing& processing) override {
    if (!deferred_) return Model::EnqueueStepSampling(rows, processing);
    ++processed_steps;
    return EnqueueSampling(rows, processing);
  }
  absl::Status ReadSampledStep(absl::Span<GreedyToken> out) override {
    std::vector<std::vector<kernels::TopLogprob>> top(out.size());
    return ReadSampledStepWithTop(out, absl::MakeSpan(top));
  }
  absl::Status ReadSampledStepWithTop(
      absl::Span<GreedyToken> out, absl::Span<std::vector<kernels::TopLogprob>> top) override {
    if (unread_.empty()) return absl::FailedPreconditionError("nothing unread");
    Step& s = unread_.front();
    if (out.size() != s.tokens.size() || top.size() != out.size()) {
      return absl::InvalidArgumentError("wrong size");
    }
    for (size_t r = 0; r < out.size(); ++r) {
      out[r] = s.tokens[r];
      top[r] = std::move(s.top[r]);
    }
    unread_.pop_front();
    return absl::OkStatus();
  }
  int NumUnreadSteps() const override { return static_cast<int>(unread_.size()); }

  int plain_steps = 0, processed_steps = 0, deferred_steps = 0, overlapped_forwards = 0;

 private:
  struct Step {
    std::vector<GreedyToken> tokens;
    std::vector<std::vector<kernels::TopLogprob>> top;
  };

  absl::Status Enqueue(const ForwardInput& input, KvCache& kv,
                       absl::Span<const kernels::SamplingRow> rows,
                       const DeviceLogitsProcessing& processing) {
    if (absl::Status s = EnqueueForward(input, kv); !s.ok()) return s;
    return EnqueueSampling(rows, processing);
  }

  // The forward's raw logits, kept for the sampling (pending_).
  absl::Status EnqueueForward(const ForwardInput& input, KvCache& kv) {
    if (static_cast<int>(unread_.size()) >= kMaxUnreadSteps) {
      return absl::FailedPreconditionError("too many unread");
    }
    const int64_t n = static_cast<int64_t>(input.logits_indices.size());
    ForwardInput resolved = input;
    for (int32_t& id : resolved.token_ids) {
      if (id < 0) {
        const size_t r = static_cast<size_t>(-(id + 1));
        if (r >= prev_.size()) return absl::InvalidArgumentError("row reference");
        id = prev_[r];
      }
    }
    const int64_t vocab = ChecksumModel::kVocab;
    std::vector<float> raw(n * vocab);
    if (absl::Status s = Forward(resolved, kv, absl::MakeSpan(raw)); !s.ok()) return s;
    pending_ = std::move(raw);
    return absl::OkStatus();
  }

  absl::Status EnqueueSampling(absl::Span<const kernels::SamplingRow> rows,
                               const DeviceLogitsProcessing& processing) {
    if (!pending_.has_value()) return absl::FailedPreconditionError("no forward pending");
    std::vector<float> raw = std::move(*pending_);
    pending_.reset();
    const int64_t vocab = ChecksumModel::kVocab;
    const int64_t n = static_cast<int64_t>(raw.size()) / vocab;
    if (static_cast<int64_t>(rows.size()) != n) return absl::InvalidArgumentError("rows");
    std::vector<float> processed = raw;
    if (!processing.rows.empty()) {
      kernels::LogitsProcessingCpu(raw.data(), n, vocab, processing.rows.data(),
                                   processing.ids.data(), processing.masks.data(), prev_.data(),
                                   static_cast<int64_t>(prev_.size()), processed.data());
      // A grammar row's logprobs are those of its masked logits (LogprobRowsCuda's mask_rows).
      for (int64_t r = 0; r < n; ++r) {
        if (processing.rows[r].mask_begin < 0) continue;
        kernels::LogitsProcessingRow mask_only;
        mask_only.mask_begin = processing.rows[r].mask_begin;
        kernels::LogitsProcessingCpu(raw.data() + r * vocab, 1, vocab, &mask_only, nullptr,
                                     processing.masks.data(), nullptr, 0,
                                     raw.data() + r * vocab);
      }
    }
    Step step;
    for (int64_t r = 0; r < n; ++r) {
      const absl::Span<const float> row(raw.data() + r * vocab, vocab);
      const kernels::SampleRowResult res =
          kernels::SampleRowCpu(processed.data() + r * vocab, vocab, rows[r]);
      const double lse = kernels::LogSumExpCpu(row);
      step.tokens.push_back(
          GreedyToken{res.token, static_cast<float>(static_cast<double>(row[res.token]) - lse)});
      const int32_t count = processing.top_logprobs.empty() ? 0 : processing.top_logprobs[r];
      step.top.push_back(count > 0 ? kernels::TopLogprobsCpu(row, lse, count)
                                   : std::vector<kernels::TopLogprob>{});
    }
    prev_.clear();
    for (const GreedyToken& t : step.tokens) prev_.push_back(t.token_id);
    unread_.push_back(std::move(step));
    return absl::OkStatus();
  }

  ChecksumModel inner_;
  bool device_processing_;
  bool deferred_;
  std::optional<std::vector<float>> pending_;  // a deferred forward's raw logits
  std::vector<int32_t> prev_;  // the newest enqueued step's tokens
  std::deque<Step> unread_;
};

std::vector<EngineRequest> PenalizedRequests() {
  std::vector<EngineRequest> out;
  for (int i = 0; i < 12; ++i) {
    EngineRequest r;
    r.request_id = absl::StrCat("r", i);
    r.prompt_token_ids = testing::ChecksumPrompt(4 + 3 * i, i);
    SamplingParams& p = r.sampling;
    p.max_tokens = 10 + i % 7;
    p.seed = 1000 + i;
    switch (i % 6) {
      case 0:
        p.repetition_penalty = 1.5f;
        p.logprobs = 5;
        break;
      case 1:
        p.temperature = 0.9f;
        p.frequency_penalty = 1.0f;
        p.presence_penalty = 0.5f;
        break;
      case 2:
        p.frequency_penalty = 2.0f;
        p.presence_penalty = -2.0f;
        p.logprobs = 20;
        p.min_tokens = 5;
        p.stop_token_ids = {5, 9, 17};
        break;
      case 3:
        p.temperature = 1.2f;
        p.top_k = 8;
        p.repetition_penalty = 0.7f;
        p.logprobs = 1;
        p.min_tokens = 4;
        break;
      case 4:
        p.temperature = 0.8f;  // no processing
        break;
      default:
        p.logprobs = 3;  // top logprobs only
        break;
    }
    out.push_back(std::move(r));
  }
  return out;
}

struct EngineRun {
  std::map<std::string, std::vector<SampledToken>> tokens;
  std::map<std::string, FinishReason> finish;
  int64_t preemptions = 0;
};

// Every third request constrained by `grammar` when it is set.
EngineRun RunAll(bool async, bool device_processing, int64_t num_kv_blocks,
                 int* plain_steps = nullptr, int* processed_steps = nullptr,
                 std::shared_ptr<const grammar::CompiledGrammar> grammar = nullptr,
                 bool deferred = false, int* overlapped_forwards = nullptr) {
  auto owned = std::make_unique<HostAsyncModel>(device_processing, deferred);
  HostAsyncModel* model = owned.get();
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = num_kv_blocks;
  options.max_model_len = 64;
  options.max_num_seqs = 8;
  options.async_scheduling = async;
  auto engine = LLMEngine::Create(std::move(owned), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  EngineRun run;
  if (!engine.ok()) return run;
  std::vector<EngineRequest> requests = PenalizedRequests();
  for (size_t i = 0; grammar != nullptr && i < requests.size(); i += 3) {
    requests[i].grammar = grammar;
  }
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
  run.preemptions = (*engine)->counters().num_preemptions;
  if (plain_steps != nullptr) *plain_steps = model->plain_steps;
  if (processed_steps != nullptr) *processed_steps = model->processed_steps;
  if (overlapped_forwards != nullptr) *overlapped_forwards = model->overlapped_forwards;
  return run;
}

void ExpectSame(const EngineRun& want, const EngineRun& got) {
  ASSERT_EQ(want.tokens.size(), got.tokens.size());
  for (const auto& [id, w] : want.tokens) {
    const std::vector<SampledToken>& g = got.tokens.at(id);
    ASSERT_EQ(g.size(), w.size()) << id;
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_EQ(g[i].token_id, w[i].token_id) << id << " token " << i;
      EXPECT_EQ(g[i].logprob, w[i].logprob) << id << " token " << i;
      ASSERT_EQ(g[i].top_logprobs.size(), w[i].top_logprobs.size()) << id << " token " << i;
      for (size_t j = 0; j < w[i].top_logprobs.size(); ++j) {
        EXPECT_EQ(g[i].top_logprobs[j].token_id, w[i].top_logprobs[j].token_id);
        EXPECT_EQ(g[i].top_logprobs[j].logprob, w[i].top_logprobs[j].logprob);
      }
    }
  }
  EXPECT_EQ(want.finish, got.finish);
}

TEST(DeviceLogitsProcessingEngineTest, AsyncProcessedStepsEqualHostSampling) {
  for (int64_t blocks : {int64_t{256}, int64_t{24}}) {  // 24 blocks of 4: preemptions
    const EngineRun sync = RunAll(/*async=*/false, /*device_processing=*/true, blocks);
    int plain = 0, processed = 0;
    const EngineRun async =
        RunAll(/*async=*/true, /*device_processing=*/true, blocks, &plain, &processed);
    ExpectSame(sync, async);
    EXPECT_GT(processed, 10) << "blocks " << blocks;  // penalized rows ran asynchronously
    if (blocks == 24) EXPECT_GT(async.preemptions, 0);
    int64_t top_entries = 0, min_tokens_rows = 0;
    for (const auto& [id, tokens] : sync.tokens) {
      for (const SampledToken& t : tokens) top_entries += t.top_logprobs.size();
    }
    EXPECT_GT(top_entries, 0);
    for (const EngineRequest& r : PenalizedRequests()) {
      if (r.sampling.min_tokens == 0) continue;
      ++min_tokens_rows;
      EXPECT_GE(sync.tokens.at(r.request_id).size(), static_cast<size_t>(r.sampling.min_tokens));
    }
    EXPECT_GT(min_tokens_rows, 0);
  }
}

// A model without device logits processing keeps the old rule: penalized / top-logprob rows
// force synchronous steps with host sampling (IsDeviceSamplable), with the same results.
TEST(DeviceLogitsProcessingEngineTest, WithoutDeviceProcessingPenalizedRowsRunSynchronously) {
  const EngineRun sync = RunAll(false, false, 256);
  int plain = 0, processed = 0;
  const EngineRun async = RunAll(true, false, 256, &plain, &processed);
  ExpectSame(sync, async);
  EXPECT_EQ(processed, 0);
}

// Grammar-constrained rows on the device path: the mask travels in the processing rows
// (LogitsProcessingRow::mask_begin), the step is read before the next one is enqueued (the next
// mask needs its token), and tokens, logprobs and finish reasons equal the host path's
// (ApplyTokenBitmask, then SampleToken). Every constrained output follows the grammar.
// A regex over ChecksumModel's 64 ids: letters, digit pairs and the EOS.
std::shared_ptr<const grammar::CompiledGrammar> ChecksumRegex() {
  std::vector<std::string> tokens(ChecksumModel::kVocab);
  for (int i = 2; i < ChecksumModel::kVocab; ++i) {
    tokens[i] = i < 28 ? std::string(1, static_cast<char>('a' + i - 2))
                       : absl::StrCat(i % 10, (i / 10) % 10);
  }
  auto vocab = grammar::TokenVocab::FromTokens(tokens, {ChecksumModel::kEos});
  grammar::GrammarCompiler compiler(vocab);
  auto regex = compiler.Compile({grammar::GrammarKind::kRegex, "[a-f]{2,6}[0-9]+", {}});
  EXPECT_TRUE(regex.ok()) << regex.status();
  return regex.ok() ? *regex : nullptr;
}

// Every constrained request's output follows `regex`; returns how many were checked.
int CheckConstrained(const EngineRun& run,
                     const std::shared_ptr<const grammar::CompiledGrammar>& regex) {
  int constrained = 0;
  for (size_t i = 0; i < PenalizedRequests().size(); i += 3) {
    const std::string id = absl::StrCat("r", i);
    grammar::GrammarMatcher m(regex, std::vector<int32_t>{ChecksumModel::kEos});
    for (const SampledToken& t : run.tokens.at(id)) {
      EXPECT_TRUE(m.AcceptToken(t.token_id)) << id << " token " << t.token_id;
    }
    ++constrained;
  }
  return constrained;
}

TEST(DeviceLogitsProcessingEngineTest, GrammarRowsOnTheDeviceEqualHostSampling) {
  const auto regex = ChecksumRegex();
  ASSERT_NE(regex, nullptr);
  const EngineRun sync = RunAll(/*async=*/false, /*device_processing=*/true, 256, nullptr,
                                nullptr, regex);
  int plain = 0, processed = 0;
  const EngineRun async = RunAll(/*async=*/true, /*device_processing=*/true, 256, &plain,
                                 &processed, regex);
  ExpectSame(sync, async);
  EXPECT_GT(processed, 10);  // grammar rows ran as processed asynchronous steps
  EXPECT_EQ(CheckConstrained(async, regex), 4);
}

// With deferred sampling, a plan with grammar rows is enqueued (its forward) while the step
// before it is in flight; the masks are built after that step is read. Same tokens, logprobs
// and finish reasons as host sampling, and most grammar steps overlapped the step before.
TEST(DeviceLogitsProcessingEngineTest, GrammarMasksBuiltWhileTheForwardRunsEqualHostSampling) {
  const auto regex = ChecksumRegex();
  ASSERT_NE(regex, nullptr);
  for (int64_t blocks : {int64_t{256}, int64_t{24}}) {  // 24 blocks of 4: preemptions
    const EngineRun sync = RunAll(/*async=*/false, /*device_processing=*/true, blocks, nullptr,
                                  nullptr, regex);
    int plain = 0, processed = 0, overlapped = 0;
    const EngineRun async = RunAll(/*async=*/true, /*device_processing=*/true, blocks, &plain,
                                   &processed, regex, /*deferred=*/true, &overlapped);
    ExpectSame(sync, async);
    EXPECT_EQ(CheckConstrained(async, regex), 4);
    EXPECT_GT(overlapped, 10) << "blocks " << blocks;
    if (blocks == 24) EXPECT_GT(async.preemptions, 0);
  }
}

}  // namespace
}  // namespace sluice
