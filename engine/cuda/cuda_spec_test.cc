// Speculative decoding on the CUDA runners (GPU only; part of cuda_model_test). A verify step
// (engine/spec) runs every decode sequence's last token and its drafts as one multi-token row
// of the runner's eager path, with k + 1 logits rows per sequence
// (CudaRunnerOptions::max_num_logits):
//  * Runner: a verify-shaped step's logits equal those of the same positions decoded one token
//    per step (decode graphs) within the bf16 bar — bit for bit in batch-invariant mode — and
//    its device greedy rows are the host argmax of its logits; more rows than max_num_logits
//    are refused.
//  * Engine: greedy with speculation gives the tokens of greedy without it (the plain engine
//    runs async with device sampling, as served) — n-gram lookup on llama-tiny, the CPU
//    sluice-mini-draft for sluice-mini-moe, fixed k and auto, and a drafter whose third draft
//    is always wrong (every verification rejects). Batch-invariant mode: the same tokens and
//    logprobs, penalties, top logprobs and stop ids included. Default mode (GEMM shapes differ
//    between a verify row and a decode row, so bf16 rounding may differ): the same tokens up
//    to a first difference, if any, where the two tokens' logits are within the bf16 bar.
//  * MTP is refused with the CUDA reason.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda/cuda_model.h"
#include "engine/model/model_config.h"
#include "engine/sched/llm_engine.h"
#include "engine/spec/draft_model_drafter.h"
#include "engine/spec/ngram_drafter.h"
#include "engine/spec/speculative.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_common.h"
#include "tests/util/fake_models.h"
#include "tests/util/golden_runner.h"
#include "tests/util/spec_results.h"
#include "tests/util/test_paths.h"

namespace sluice::cuda_runner {
namespace {

constexpr int64_t kBlockSize = 16;
constexpr int32_t kMaxSeqs = 16;
constexpr int32_t kK = 5;
constexpr float kMaxLogitDiff = 0.15f;  // the fixtures' bf16 bar (cuda_model_test.cc)

CudaRunnerOptions SpecRunnerOptions(bool batch_invariant) {
  CudaRunnerOptions o;
  o.block_size = kBlockSize;
  o.max_model_len = 512;
  o.max_num_tokens = 512;
  o.max_num_seqs = kMaxSeqs;
  o.max_num_logits = kMaxSeqs * (1 + kK);  // what model_runtime.cc plans for k = 5
  o.graph_batch_sizes = {1, 2, 4, 8, 16};
  for (int32_t q = 2; q <= 1 + kK; ++q) o.graph_query_lens.push_back(q);  // as model_runtime.cc
  // Two runner instances are compared: keep cuBLASLt's heuristic plans (cuda_engine_test.cc).
  o.autotune_gemms = false;
  o.batch_invariant = batch_invariant;
  return o;
}

class CudaSpecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  }
};

// ---- Runner: a verify-shaped step against decode steps.

struct SeqPlan {
  std::vector<int32_t> tokens;  // prompt then the k + 1 positions verified
  int32_t prompt = 0;
  std::vector<int32_t> table;
};

// Plan: for each sequence, positions [from, to) on top of `from` cached ones; with `logits`
// a logits row for every one of them.
ForwardInput Plan(const std::vector<SeqPlan>& seqs, const std::vector<int32_t>& from,
                  const std::vector<int32_t>& to, bool logits) {
  ForwardInput in;
  for (size_t s = 0; s < seqs.size(); ++s) {
    SequenceSlice slice;
    slice.query_start = static_cast<int32_t>(in.token_ids.size());
    slice.num_query_tokens = to[s] - from[s];
    slice.num_context_tokens = from[s];
    slice.block_table = absl::MakeConstSpan(seqs[s].table);
    for (int32_t p = from[s]; p < to[s]; ++p) {
      if (logits) in.logits_indices.push_back(static_cast<int32_t>(in.token_ids.size()));
      in.token_ids.push_back(seqs[s].tokens[p]);
      in.positions.push_back(p);
      in.slot_mapping.push_back(int64_t{seqs[s].table[p / kBlockSize]} * kBlockSize +
                                p % kBlockSize);
    }
    in.sequences.push_back(slice);
  }
  return in;
}

// `min_top1`: the fraction of rows whose argmax agrees in default mode. Llama-tiny's rows stay
// within the bf16 bar; sluice-mini-moe's logits reach |20| and bf16 flips some MoE routing
// choices, so its bar is top-1 only (as in cuda_model_test.cc's goldens).
// RowAgreement: rows of `a` and `b` ([n, V]) within the bar, bitwise equal, same argmax.
struct RowAgreement {
  int64_t within = 0, bitwise = 0, top1 = 0;
};
RowAgreement CompareRows(const float* a, const float* b, int64_t n, int64_t V) {
  RowAgreement r;
  for (int64_t i = 0; i < n; ++i, a += V, b += V) {
    float diff = 0;
    for (int64_t v = 0; v < V; ++v) diff = std::max(diff, std::fabs(a[v] - b[v]));
    r.within += diff <= kMaxLogitDiff;
    r.bitwise += std::equal(a, a + V, b);
    r.top1 += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
  }
  return r;
}

// ExpectAgreement: batch-invariant mode: every row bit for bit; default mode: every row within
// the bar (when `rows_within_bar`) and at least `min_top1` of them with the same argmax.
void ExpectAgreement(const RowAgreement& r, int64_t n, bool batch_invariant,
                     bool rows_within_bar, double min_top1, const std::string& what) {
  std::printf("%s: within %.2f %lld/%lld, bitwise %lld, top-1 %lld\n", what.c_str(),
              kMaxLogitDiff, static_cast<long long>(r.within), static_cast<long long>(n),
              static_cast<long long>(r.bitwise), static_cast<long long>(r.top1));
  if (batch_invariant) {
    EXPECT_EQ(r.bitwise, n) << what;
    return;
  }
  if (rows_within_bar) EXPECT_EQ(r.within, n) << what;
  EXPECT_GE(static_cast<double>(r.top1), min_top1 * static_cast<double>(n)) << what;
}

void CheckVerifyStepMatchesDecodeSteps(const std::string& dir, bool batch_invariant,
                                       bool rows_within_bar, double min_top1) {
  auto loaded = LoadCudaRunner(dir, SpecRunnerOptions(batch_invariant));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  CudaRunner* runner = loaded->get();
  auto model = absl::StatusOr<std::unique_ptr<Model>>(WrapRunner(*std::move(loaded)));
  const int64_t V = (*model)->config().vocab_size;
  constexpr int kSeqs = 12;  // 12 × 6 = 72 rows: past max_num_seqs, within max_num_logits
  constexpr int64_t kBlocks = 160;
  KvCache geometry((*model)->kv_cache_spec(), kBlocks, kBlockSize, /*allocate_storage=*/false);
  // Two copies of every sequence on disjoint blocks: one decoded, one verified.
  std::vector<SeqPlan> decoded(kSeqs), verified(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    SeqPlan p;
    p.prompt = 5 + (s * 11) % 40;
    for (int32_t i = 0; i < p.prompt + kK + 1; ++i) {
      p.tokens.push_back(static_cast<int32_t>(1 + (i * 131 + s * 977) % (V - 1)));
    }
    decoded[s] = verified[s] = p;
    for (int b = 0; b < 4; ++b) {
      decoded[s].table.push_back(s * 4 + b);
      verified[s].table.push_back(80 + s * 4 + b);
    }
  }
  std::vector<int32_t> zero(kSeqs, 0), prompt(kSeqs), end(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    prompt[s] = decoded[s].prompt;
    end[s] = prompt[s] + kK + 1;
  }
  std::vector<float> none;
  for (const auto* seqs : {&decoded, &verified}) {
    ASSERT_TRUE((*model)->Forward(Plan(*seqs, zero, prompt, false), geometry,
                                  absl::MakeSpan(none)).ok());
  }
  // Decode: one token per sequence and step (graph replays), k + 1 steps.
  std::vector<float> want(static_cast<size_t>(kSeqs * (kK + 1) * V));
  for (int j = 0; j <= kK; ++j) {
    std::vector<int32_t> from(kSeqs), to(kSeqs);
    for (int s = 0; s < kSeqs; ++s) {
      from[s] = prompt[s] + j;
      to[s] = from[s] + 1;
    }
    std::vector<float> rows(static_cast<size_t>(kSeqs * V));
    ASSERT_TRUE((*model)->Forward(Plan(decoded, from, to, true), geometry,
                                  absl::MakeSpan(rows)).ok());
    for (int s = 0; s < kSeqs; ++s) {
      std::copy(rows.begin() + s * V, rows.begin() + (s + 1) * V,
                want.begin() + (s * (kK + 1) + j) * V);
    }
  }
  // Verify: all k + 1 positions of every sequence in one step, 72 logits rows. It replays the
  // multi-token decode graph of k + 1 query tokens and 16 sequences (4 padded).
  const ForwardInput verify = Plan(verified, prompt, end, true);
  ASSERT_EQ(verify.logits_indices.size(), static_cast<size_t>(kSeqs * (kK + 1)));
  std::vector<float> got(want.size());
  ASSERT_TRUE((*model)->Forward(verify, geometry, absl::MakeSpan(got)).ok());
  EXPECT_TRUE(runner->last_step().graph);
  EXPECT_EQ(runner->last_step().graph_query_len, kK + 1);
  EXPECT_EQ(runner->last_step().graph_batch, kMaxSeqs);
  const int64_t n = kSeqs * (kK + 1);
  const std::string name = dir + (batch_invariant ? " (batch invariant)" : "");
  ExpectAgreement(CompareRows(want.data(), got.data(), n, V), n, batch_invariant,
                  rows_within_bar, min_top1, name + ": verify (graph) vs decode rows");
  // The same step eagerly (ProfileStep never replays a graph): padding changes no real row
  // beyond the bf16 bar (GEMM shapes differ), and none at all in batch-invariant mode.
  ASSERT_TRUE(runner->ProfileStep(verify).ok());
  EXPECT_FALSE(runner->last_step().graph);
  absl::StatusOr<std::vector<float>> eager = runner->Logits();
  ASSERT_TRUE(eager.ok()) << eager.status();
  ExpectAgreement(CompareRows(eager->data(), got.data(), n, V), n, batch_invariant,
                  rows_within_bar, min_top1, name + ": verify graph vs eager");
  // Ragged rows, as auto verification plans them: sequence s verifies 1 + s % (k + 1)
  // positions (rewriting the same K/V). The graph of k + 1 query tokens pads each to k + 1;
  // its rows are the decode rows of the same positions.
  {
    std::vector<int32_t> ragged_end(kSeqs);
    for (int s = 0; s < kSeqs; ++s) ragged_end[s] = prompt[s] + 1 + s % (kK + 1);
    const ForwardInput ragged = Plan(verified, prompt, ragged_end, true);
    std::vector<float> rows(ragged.logits_indices.size() * V), want_rows;
    ASSERT_TRUE((*model)->Forward(ragged, geometry, absl::MakeSpan(rows)).ok());
    EXPECT_TRUE(runner->last_step().graph);
    EXPECT_EQ(runner->last_step().graph_query_len, kK + 1);
    for (int s = 0; s < kSeqs; ++s) {
      const float* first = want.data() + s * (kK + 1) * V;
      want_rows.insert(want_rows.end(), first, first + (ragged_end[s] - prompt[s]) * V);
    }
    const int64_t rn = static_cast<int64_t>(ragged.logits_indices.size());
    ExpectAgreement(CompareRows(want_rows.data(), rows.data(), rn, V), rn, batch_invariant,
                    rows_within_bar, min_top1, name + ": ragged verify (graph) vs decode rows");
  }
  // Padding rows wrote no K/V: position end + 1 decoded on both copies (a decode graph) reads
  // the K/V of every verified position, the padded positions of the ragged step included.
  {
    std::vector<int32_t> next(kSeqs), after(kSeqs);
    for (int s = 0; s < kSeqs; ++s) {
      decoded[s].tokens.push_back(7);
      verified[s].tokens.push_back(7);
      next[s] = end[s];
      after[s] = end[s] + 1;
    }
    std::vector<float> a(static_cast<size_t>(kSeqs * V)), b(a.size());
    ASSERT_TRUE((*model)->Forward(Plan(decoded, next, after, true), geometry,
                                  absl::MakeSpan(a)).ok());
    ASSERT_TRUE((*model)->Forward(Plan(verified, next, after, true), geometry,
                                  absl::MakeSpan(b)).ok());
    ExpectAgreement(CompareRows(a.data(), b.data(), kSeqs, V), kSeqs, batch_invariant,
                    rows_within_bar, min_top1, name + ": decode after verify vs after decode");
  }
  // The same verify step through ForwardGreedy (the engine's plain greedy path; it rewrites the
  // same K/V): per row, the argmax of the logits above.
  std::vector<GreedyToken> greedy(static_cast<size_t>(n));
  ASSERT_TRUE((*model)->ForwardGreedy(verify, geometry, absl::MakeSpan(greedy)).ok());
  for (int64_t r = 0; r < n; ++r) {
    const float* b = got.data() + r * V;
    EXPECT_EQ(greedy[r].token_id, std::max_element(b, b + V) - b) << "row " << r;
  }
  // More rows than max_num_logits: refused, naming the limit.
  ForwardInput too_many = verify;
  while (too_many.logits_indices.size() <= static_cast<size_t>(kMaxSeqs * (1 + kK))) {
    too_many.logits_indices.push_back(0);
  }
  std::vector<float> big(too_many.logits_indices.size() * V);
  const absl::Status refused = (*model)->Forward(too_many, geometry, absl::MakeSpan(big));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("logits rows exceeds the limits"), std::string::npos);
}

TEST_F(CudaSpecTest, LlamaVerifyStepMatchesDecodeSteps) {
  for (bool invariant : {false, true}) {
    CheckVerifyStepMatchesDecodeSteps(testing::FixtureDir("llama-tiny"), invariant, true, 0.95);
  }
}

TEST_F(CudaSpecTest, DeepseekVerifyStepMatchesDecodeSteps) {
  for (bool invariant : {false, true}) {
    CheckVerifyStepMatchesDecodeSteps(testing::SharedModelDir("sluice-mini-moe"), invariant,
                                      false, 0.95);
  }
}

// ---- Engine: greedy with speculation against greedy without.

using Results = testing::RequestResults;

// OracleDrafter proposes the plain run's continuation with its third draft replaced by another
// token: every verification of three or more drafts accepts two and rejects the third.
class OracleDrafter : public Drafter {
 public:
  OracleDrafter(const Results& plain, const std::vector<EngineRequest>& requests, int32_t vocab)
      : vocab_(vocab) {
    for (const EngineRequest& r : requests) {
      prompt_len_[r.request_id] = static_cast<int32_t>(r.prompt_token_ids.size());
      next_[r.request_id] = plain.at(r.request_id).tokens;
    }
  }
  std::string_view method() const override { return "oracle"; }
  absl::Status Propose(absl::Span<const DraftInput> inputs, const DraftContinue&,
                       std::vector<DraftOutput>* outputs) override {
    outputs->assign(inputs.size(), DraftOutput{});
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string id(inputs[i].request_id);
      const std::vector<int32_t>& plain = next_.at(id);
      const size_t done = inputs[i].token_ids.size() - prompt_len_.at(id);
      for (size_t j = 0; j < static_cast<size_t>(inputs[i].max_draft_tokens) &&
                         done + j < plain.size();
           ++j) {
        const int32_t t = plain[done + j];
        (*outputs)[i].tokens.push_back(j == 2 ? (t + 1) % vocab_ : t);
        (*outputs)[i].confidence.push_back(0.9f);
      }
    }
    return absl::OkStatus();
  }

 private:
  int32_t vocab_;
  std::map<std::string, int32_t> prompt_len_;
  std::map<std::string, std::vector<int32_t>> next_;
};

struct EngineRun {
  Results results;
  EngineCounters counters;
};

EngineRun RunEngine(const std::string& dir, bool batch_invariant,
                    std::shared_ptr<Drafter> drafter, VerifyMode mode,
                    const std::vector<EngineRequest>& requests) {
  EngineRun run;
  auto model = LoadCudaModel(dir, SpecRunnerOptions(batch_invariant));
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return run;
  EngineOptions options;
  options.block_size = kBlockSize;
  options.num_kv_blocks = 256;
  options.allocate_host_kv_cache = false;
  options.max_model_len = 512;
  options.max_num_seqs = kMaxSeqs;
  options.batch_invariant = batch_invariant;
  options.speculative.drafter = std::move(drafter);
  options.speculative.verify = mode;
  options.speculative.num_speculative_tokens = kK;
  auto engine = LLMEngine::Create(std::move(*model), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return run;
  for (const EngineRequest& r : requests) EXPECT_TRUE((*engine)->AddRequest(r).ok());
  for (int step = 0; (*engine)->HasUnfinishedRequests() && step < 5000; ++step) {
    const std::vector<RequestOutput> outputs = (*engine)->Step();
    for (const RequestOutput& out : outputs) {
      EXPECT_TRUE(out.status.ok()) << out.request_id << ": " << out.status;
    }
    testing::AddOutputs(outputs, &run.results);
  }
  EXPECT_FALSE((*engine)->HasUnfinishedRequests());
  EXPECT_EQ((*engine)->num_free_blocks(), (*engine)->num_total_blocks());
  run.counters = (*engine)->counters();
  return run;
}

// Default mode (plain greedy requests only): the same tokens up to the first difference, where
// the target's logits of the two tokens (teacher-forced over the shared prefix on a reference
// runner) are within `tie_bar`: a near-tie that rounding decided, not a wrong verification.
// Returns the requests that differed.
int ExpectSameUpToNearTies(const std::string& dir, float tie_bar,
                           const std::vector<EngineRequest>& requests, const Results& plain,
                           const Results& spec) {
  CudaRunnerOptions o = SpecRunnerOptions(false);
  o.max_num_logits = 512;  // RunGreedy asks for every prompt position
  auto reference = LoadCudaModel(dir, o);
  EXPECT_TRUE(reference.ok()) << reference.status();
  if (!reference.ok()) return 0;
  const int64_t V = (*reference)->config().vocab_size;
  int differed = 0;
  for (const EngineRequest& r : requests) {
    SCOPED_TRACE(r.request_id);
    const std::vector<int32_t>& a = plain.at(r.request_id).tokens;
    const std::vector<int32_t>& b = spec.at(r.request_id).tokens;
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    if (i == a.size() && i == b.size()) continue;
    ++differed;
    if (i >= std::min(a.size(), b.size())) {
      ADD_FAILURE() << "one output is a prefix of the other";
      continue;
    }
    std::vector<int32_t> forced = r.prompt_token_ids;
    forced.insert(forced.end(), a.begin(), a.begin() + static_cast<int64_t>(i));
    testing::GoldenRunOptions opt;
    opt.block_size = kBlockSize;
    opt.num_new_tokens = 1;
    auto run = testing::RunGreedy(**reference, forced, opt);
    if (!run.ok()) {
      ADD_FAILURE() << run.status();
      continue;
    }
    const float* row = run->logits.data() + (static_cast<int64_t>(forced.size()) - 1) * V;
    const float gap = std::fabs(row[a[i]] - row[b[i]]);
    std::printf("%s: first difference at token %zu (%d vs %d), logit gap %.4f\n",
                r.request_id.c_str(), i, a[i], b[i], gap);
    EXPECT_LE(gap, tie_bar) << "token " << i << ": " << a[i] << " vs " << b[i];
  }
  return differed;
}

constexpr auto Encode = testing::EncodeText;

std::vector<EngineRequest> MiniMoeRequests(const std::string& dir) {
  const char* texts[] = {
      "Ge1:1 In the beginning God created the heaven and the earth. Ge1:2 And the earth was "
      "without form, and void; and darkness was upon the face of the deep. Ge1:3 And God said,",
      "Joh3:16 For God so loved the world,",
      "Ps23:1 The LORD is my shepherd;",
      "Ex20:3 Thou shalt have no other gods",
  };
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back(testing::GreedyRequest("p" + std::to_string(i), Encode(dir, texts[i]), 40));
  }
  requests.push_back(testing::GreedyRequest("p0-choice1", requests[0].prompt_token_ids, 40));
  requests[1].sampling.logprobs = 3;  // host verification over the step's full logits
  return requests;
}

std::vector<EngineRequest> LlamaRequests(const std::string& dir) {
  std::vector<int32_t> repetitive;
  for (int r = 0; r < 6; ++r) {
    for (int32_t t : {100, 200, 300, 400, 500, 600, 700}) repetitive.push_back(t + r % 2);
  }
  std::vector<EngineRequest> requests;
  requests.push_back(testing::GreedyRequest("rep", repetitive, 48));
  requests.push_back(testing::GreedyRequest("rep-choice1", repetitive, 48));
  requests.push_back(
      testing::GreedyRequest("text", Encode(dir, "the cat sat on the mat and the cat"), 32));
  requests[1].sampling.logprobs = 2;
  return requests;
}

// Penalties, top logprobs and a stop id from the plain output: exact only in batch-invariant
// mode (their choices are not plain argmaxes of the raw logits).
void AddExactOnlyRequests(std::vector<EngineRequest>& requests, const Results& plain) {
  EngineRequest pen = requests[0];
  pen.request_id = "penalties";
  pen.sampling.repetition_penalty = 1.3f;
  pen.sampling.frequency_penalty = 0.5f;
  pen.sampling.logprobs = 5;
  pen.sampling.max_tokens = 13;
  requests.push_back(pen);
  EngineRequest stop = requests[0];
  stop.request_id = "stop-id";
  const std::vector<int32_t>& first = plain.at(requests[0].request_id).tokens;
  EXPECT_GT(first.size(), 10u);
  if (first.size() > 10) stop.sampling.stop_token_ids = {first[9]};
  requests.push_back(stop);
}

// `tie_bar`: ExpectSameUpToNearTies' bar in default mode.
void CheckSpecEqualsPlain(const std::string& dir, float tie_bar,
                          const std::vector<EngineRequest>& base_requests,
                          const std::function<std::shared_ptr<Drafter>()>& make_drafter) {
  const int32_t vocab = static_cast<int32_t>(ModelConfig::Load(dir)->vocab_size);
  for (bool invariant : {true, false}) {
    SCOPED_TRACE(invariant ? "batch invariant" : "default kernels");
    std::vector<EngineRequest> requests = base_requests;
    if (invariant) {
      const EngineRun first = RunEngine(dir, true, nullptr, VerifyMode::kAuto, requests);
      AddExactOnlyRequests(requests, first.results);
    }
    const EngineRun plain = RunEngine(dir, invariant, nullptr, VerifyMode::kAuto, requests);
    if (invariant) {
      EXPECT_EQ(plain.results.at("stop-id").reason, FinishReason::kStop);
    }
    struct Arm {
      const char* name;
      std::shared_ptr<Drafter> drafter;
      VerifyMode mode;
    };
    const Arm arms[] = {
        {"fixed k=5", make_drafter(), VerifyMode::kFixed},
        {"auto", make_drafter(), VerifyMode::kAuto},
        {"oracle, third draft wrong", std::make_shared<OracleDrafter>(plain.results, requests,
                                                                      vocab),
         VerifyMode::kFixed},
    };
    for (const Arm& arm : arms) {
      SCOPED_TRACE(arm.name);
      const EngineRun spec = RunEngine(dir, invariant, arm.drafter, arm.mode, requests);
      const EngineCounters& c = spec.counters;
      std::printf("%s %s%s: %lld verifications, %lld drafts, %lld accepted\n", dir.c_str(),
                  arm.name, invariant ? " (batch invariant)" : "",
                  static_cast<long long>(c.num_spec_verifications),
                  static_cast<long long>(c.num_spec_draft_tokens),
                  static_cast<long long>(c.num_spec_accepted_tokens));
      if (invariant) {
        // Identical tokens, finish reasons, logprobs and top-logprob ids.
        testing::ExpectSameResults(plain.results, spec.results);
      } else {
        const int differed =
            ExpectSameUpToNearTies(dir, tie_bar, requests, plain.results, spec.results);
        std::printf("  %d of %zu requests differ (at near-ties)\n", differed, requests.size());
      }
      EXPECT_GT(c.num_spec_verifications, 0);
      if (std::string(arm.name).rfind("oracle", 0) == 0) {
        // Drafts accepted and rejected (the later rows of those steps thrown away): two
        // accepted per verification, the third rejected (fewer only at the end of an output;
        // in default mode also after a near-tie difference, where the oracle drafts the plain
        // run's tokens for another context).
        EXPECT_GT(c.num_spec_accepted_tokens, 0);
        EXPECT_LT(c.num_spec_accepted_tokens, c.num_spec_draft_tokens);
        EXPECT_LE(c.num_spec_accepted_tokens, 2 * c.num_spec_verifications);
        if (invariant) {
          EXPECT_GE(c.num_spec_accepted_tokens, c.num_spec_verifications);
        }
      }
    }
  }
}

TEST_F(CudaSpecTest, NgramGreedyEqualsPlainOnLlamaTiny) {
  const std::string dir = testing::FixtureDir("llama-tiny");
  CheckSpecEqualsPlain(dir, kMaxLogitDiff, LlamaRequests(dir),
                       [] { return std::make_shared<NgramDrafter>(); });
}

DraftModelOptions DraftOptions() {
  DraftModelOptions options;
  options.block_size = kBlockSize;
  options.num_kv_blocks = 256;
  options.model_id = "sluice-mini-draft";
  return options;
}

std::shared_ptr<Drafter> MiniDrafter(std::unique_ptr<Model> draft,
                                     const DraftModelOptions& options) {
  auto drafter = DraftModelDrafter::Create(std::move(draft), options);
  EXPECT_TRUE(drafter.ok()) << drafter.status();
  if (!drafter.ok()) return nullptr;
  return std::shared_ptr<Drafter>(*std::move(drafter));
}

TEST_F(CudaSpecTest, DraftModelGreedyEqualsPlainOnMiniMoe) {
  const std::string dir = testing::SharedModelDir("sluice-mini-moe");
  const std::string draft_dir = testing::SharedModelDir("sluice-mini-draft");
  // bf16 flips some of sluice-mini-moe's MoE routing choices (its logits reach |20|): a
  // verify row and a decode row of one position can part by more than the fixtures' bar.
  CheckSpecEqualsPlain(dir, 1.0f, MiniMoeRequests(dir), [&]() -> std::shared_ptr<Drafter> {
    auto draft = LoadModel(draft_dir);  // the draft model runs on the CPU
    EXPECT_TRUE(draft.ok()) << draft.status();
    if (!draft.ok()) return nullptr;
    return MiniDrafter(*std::move(draft), DraftOptions());
  });
}

// The draft model on the GPU beside the target (`sluice serve --device cuda`): its rounds replay
// its own decode graphs, its catch-up chunks are cut to its runner's step size (16 tokens here,
// below the prompts' lengths) and its KV lives on the device.
TEST_F(CudaSpecTest, DraftModelOnGpuGreedyEqualsPlainOnMiniMoe) {
  const std::string dir = testing::SharedModelDir("sluice-mini-moe");
  const std::string draft_dir = testing::SharedModelDir("sluice-mini-draft");
  CheckSpecEqualsPlain(dir, 1.0f, MiniMoeRequests(dir), [&]() -> std::shared_ptr<Drafter> {
    CudaRunnerOptions o;
    o.block_size = kBlockSize;
    o.max_model_len = 512;
    o.max_num_tokens = 16;
    o.max_num_seqs = kMaxSeqs;
    o.graph_batch_sizes = {1, 2, 4, 8, 16};
    o.autotune_gemms = false;
    auto draft = LoadCudaModel(draft_dir, o);
    EXPECT_TRUE(draft.ok()) << draft.status();
    if (!draft.ok()) return nullptr;
    DraftModelOptions options = DraftOptions();
    options.max_tokens_per_forward = 16;
    options.host_kv_storage = false;
    return MiniDrafter(*std::move(draft), options);
  });
}

TEST_F(CudaSpecTest, MtpIsRefusedWithTheCudaReason) {
  auto model = LoadCudaModel(testing::SharedModelDir("sluice-mini-moe"), SpecRunnerOptions(false));
  ASSERT_TRUE(model.ok()) << model.status();
  const absl::Status s = (*model)->MtpStatus();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("the CUDA backend does not run MTP modules"), std::string::npos)
      << s;
}

}  // namespace
}  // namespace sluice::cuda_runner
