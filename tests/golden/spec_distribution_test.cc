// Statistical test of speculative sampling (engine/spec/rejection_sampler.h): at temperature 1
// the tokens the engine emits with a draft model are distributed as without speculation.
//
// Target: tests/fixtures/spec-tiny (a Llama of vocabulary 64 with peaked next-token
// distributions, cheap enough for many draws). Draft: spec-tiny-draft, the same weights
// perturbed, so q is correlated with p but not equal; the requests also carry a presence and a
// repetition penalty, which only the target applies. For each of the first four output
// positions the token counts of 20,000 seeded plain requests and 20,000 seeded speculative ones
// are compared with a chi-square test of homogeneity (positions 1-3 come from one verification
// of 2 drafts plus the bonus token, so acceptance, rejection and bonus paths all run); the seed
// set is fixed, so the test is deterministic. p >= 0.01 must hold at every position, with the
// draft model (sampled proposals, q a distribution) and with n-gram lookup (q one-hot).
// A deliberately wrong rule (after a rejection, resample from p instead of max(0, p - q)) must
// fail it at p < 0.01: that shows the test has the power to catch a broken sampler.
#include <cmath>
#include <iostream>
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
#include "engine/spec/rejection_sampler.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

constexpr int kDraws = 20000;
constexpr int kPositions = 4;
constexpr int64_t kBlockSize = 16;

// The classic bug: resampling from the target after a rejection double-counts the mass the
// draft already proposed.
class ResampleFromTargetRule final : public RejectionRule {
 public:
  void Residual(const std::vector<double>& p, absl::Span<const float> q, int32_t draft,
                std::vector<double>* out) const override {
    *out = p;
  }
};

std::unique_ptr<Model> Load(const std::string& dir) {
  auto model = LoadModel(dir);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// counts[position][token] over kDraws seeded requests.
using Counts = std::vector<std::map<int32_t, int64_t>>;

// kDraftModelFrSpec: the draft proposes among 40 of the 64 ids (FR-Spec; re-ranked by the
// counted tokens as requests run), so q is 0 on the others.
enum class Drafting { kNone, kDraftModel, kDraftModelFrSpec, kNgram };

const char* Name(Drafting d) {
  switch (d) {
    case Drafting::kNone: return "none";
    case Drafting::kDraftModel: return "draft model";
    case Drafting::kDraftModelFrSpec: return "draft model, FR-Spec";
    case Drafting::kNgram: return "ngram";
  }
  return "";
}

Counts Sample(Drafting drafting, std::shared_ptr<const RejectionRule> rule) {
  EngineOptions options;
  options.block_size = kBlockSize;
  options.num_kv_blocks = 1024;
  options.max_num_seqs = 256;
  options.max_num_batched_tokens = 4096;
  if (drafting == Drafting::kDraftModel || drafting == Drafting::kDraftModelFrSpec) {
    DraftModelOptions draft;
    if (drafting == Drafting::kDraftModelFrSpec) draft.draft_vocab = 40;
    draft.block_size = kBlockSize;
    draft.num_kv_blocks = 1024;
    draft.model_id = "spec-tiny-draft";
    auto drafter =
        DraftModelDrafter::Create(Load(testing::RepoFixtureDir("spec-tiny-draft")), draft);
    EXPECT_TRUE(drafter.ok()) << drafter.status();
    options.speculative.drafter = std::shared_ptr<DraftModelDrafter>(std::move(*drafter));
  } else if (drafting == Drafting::kNgram) {
    options.speculative.drafter = std::make_shared<NgramDrafter>(NgramOptions{1, 3});
  }
  options.speculative.verify = VerifyMode::kFixed;
  options.speculative.num_speculative_tokens = 2;
  options.speculative.rejection_rule = std::move(rule);
  auto engine = LLMEngine::Create(Load(testing::RepoFixtureDir("spec-tiny")), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  // 4 · 16 + 1 tokens: the prefix cache serves all but the last token of every request after
  // the first. Every id of the vocabulary occurs, so n-gram lookup always finds a match.
  std::vector<int32_t> prompt;
  for (int i = 0; i < 4 * kBlockSize + 1; ++i) prompt.push_back((i * 7) % 64);
  Counts counts(kPositions);
  std::map<std::string, std::vector<int32_t>> tokens;
  int next = 0;
  while (next < kDraws || (*engine)->HasUnfinishedRequests()) {
    // Keep at most 256 requests in flight.
    while (next < kDraws && (*engine)->num_waiting() + (*engine)->num_running() < 256) {
      EngineRequest r;
      r.request_id = std::to_string(next);
      r.prompt_token_ids = prompt;
      r.sampling.temperature = 1.0f;
      r.sampling.max_tokens = kPositions;
      r.sampling.ignore_eos = true;
      r.sampling.presence_penalty = 0.5f;
      r.sampling.repetition_penalty = 1.2f;
      r.sampling.seed = 1000003ULL * static_cast<uint64_t>(next) + 17;
      EXPECT_TRUE((*engine)->AddRequest(std::move(r)).ok());
      ++next;
    }
    for (const RequestOutput& out : (*engine)->Step()) {
      std::vector<int32_t>& t = tokens[out.request_id];
      for (const SampledToken& s : out.new_tokens) t.push_back(s.token_id);
      if (!out.finished()) continue;
      EXPECT_EQ(t.size(), static_cast<size_t>(kPositions));
      for (int i = 0; i < kPositions && i < static_cast<int>(t.size()); ++i) ++counts[i][t[i]];
      tokens.erase(out.request_id);
    }
  }
  if (drafting != Drafting::kNone) {
    const EngineCounters c = (*engine)->counters();
    EXPECT_GT(c.num_spec_accepted_tokens, 0);
    EXPECT_LT(c.num_spec_accepted_tokens, c.num_spec_draft_tokens);  // rejections happened
  }
  return counts;
}

// Upper tail of the chi-square distribution with `df` degrees of freedom, by the
// Wilson–Hilferty cube-root normal approximation (Wilson & Hilferty 1931), accurate to a few
// per cent of p for df >= 3, ample against a 0.01 threshold.
double ChiSquarePValue(double x, int df) {
  const double k = df;
  const double z = (std::cbrt(x / k) - (1.0 - 2.0 / (9.0 * k))) / std::sqrt(2.0 / (9.0 * k));
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

// Chi-square test of homogeneity of two samples of equal size over the tokens: a token with
// fewer than 20 draws in both together joins one "other" bin.
double HomogeneityPValue(const std::map<int32_t, int64_t>& a, const std::map<int32_t, int64_t>& b) {
  std::map<int32_t, std::pair<int64_t, int64_t>> joint;
  for (const auto& [t, n] : a) joint[t].first += n;
  for (const auto& [t, n] : b) joint[t].second += n;
  std::vector<std::pair<int64_t, int64_t>> bins;
  std::pair<int64_t, int64_t> other{0, 0};
  for (const auto& [t, n] : joint) {
    if (n.first + n.second >= 20) {
      bins.push_back(n);
    } else {
      other.first += n.first;
      other.second += n.second;
    }
  }
  if (other.first + other.second >= 20) bins.push_back(other);
  double na = 0, nb = 0;
  for (const auto& [x, y] : bins) {
    na += x;
    nb += y;
  }
  double stat = 0;
  for (const auto& [x, y] : bins) {
    const double total = x + y;
    const double ea = total * na / (na + nb), eb = total * nb / (na + nb);
    stat += (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb;
  }
  const int df = static_cast<int>(bins.size()) - 1;
  EXPECT_GE(df, 5) << "too few bins for a meaningful test";
  return ChiSquarePValue(stat, df);
}

TEST(SpecDistributionTest, RejectionSamplingKeepsTheTargetDistribution) {
  const Counts plain = Sample(Drafting::kNone, nullptr);
  for (Drafting drafting :
       {Drafting::kDraftModel, Drafting::kDraftModelFrSpec, Drafting::kNgram}) {
    SCOPED_TRACE(Name(drafting));
    const Counts spec = Sample(drafting, nullptr);
    for (int i = 0; i < kPositions; ++i) {
      const double p = HomogeneityPValue(plain[i], spec[i]);
      std::cout << Name(drafting) << " position " << i << ": p = " << p << "\n";
      EXPECT_GE(p, 0.01) << "position " << i;
    }
  }
  // The broken rule is caught at the positions speculation produced.
  const Counts broken = Sample(Drafting::kDraftModel, std::make_shared<ResampleFromTargetRule>());
  double min_p = 1.0;
  for (int i = 1; i < kPositions; ++i) {
    min_p = std::min(min_p, HomogeneityPValue(plain[i], broken[i]));
  }
  std::cout << "broken rule: smallest p = " << min_p << "\n";
  EXPECT_LT(min_p, 0.01);
}

}  // namespace
}  // namespace sluice
