#include "kernels/moe/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::kernels {
namespace {

// NaiveRoute follows transformers' DeepseekV3TopkRouter step by step with full sorts.
void NaiveRoute(const std::vector<float>& logits, const std::vector<float>& bias,
                const MoeRoutingParams& p, std::vector<int32_t>& ids, std::vector<float>& w) {
  const int64_t e_count = p.num_experts;
  std::vector<float> s(e_count);
  if (p.scoring == MoeScoring::kSigmoid) {
    for (int64_t e = 0; e < e_count; ++e) s[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  } else {
    float mx = *std::max_element(logits.begin(), logits.end());
    float sum = 0;
    for (int64_t e = 0; e < e_count; ++e) sum += s[e] = std::exp(logits[e] - mx);
    for (float& v : s) v /= sum;
  }
  std::vector<float> choice(e_count);
  for (int64_t e = 0; e < e_count; ++e) choice[e] = s[e] + (bias.empty() ? 0.0f : bias[e]);
  const int64_t per = e_count / p.n_group;
  std::vector<std::pair<float, int64_t>> groups;
  for (int64_t g = 0; g < p.n_group; ++g) {
    std::vector<float> members(choice.begin() + g * per, choice.begin() + (g + 1) * per);
    std::sort(members.rbegin(), members.rend());
    groups.push_back({p.group_score_max ? members[0] : members[0] + (per > 1 ? members[1] : 0.0f),
                      g});
  }
  std::stable_sort(groups.begin(), groups.end(),
                   [](auto& a, auto& b) { return a.first > b.first; });
  std::vector<bool> keep(p.n_group, false);
  for (int64_t i = 0; i < p.topk_group; ++i) keep[groups[i].second] = true;
  for (int64_t e = 0; e < e_count; ++e) {
    if (!keep[e / per]) choice[e] = 0.0f;
  }
  std::vector<int32_t> order(e_count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return choice[a] > choice[b]; });
  ids.assign(order.begin(), order.begin() + p.top_k);
  w.clear();
  double sum = 0;
  for (int32_t id : ids) {
    w.push_back(s[id]);
    sum += s[id];
  }
  for (float& v : w) {
    if (p.norm_topk_prob) v = static_cast<float>(v / (sum + 1e-20));
    v *= p.routed_scaling_factor;
  }
}

MoeRoutingParams DeepseekTinyParams() {
  MoeRoutingParams p;
  p.num_experts = 8;
  p.top_k = 2;
  p.n_group = 2;
  p.topk_group = 1;
  p.scoring = MoeScoring::kSigmoid;
  p.norm_topk_prob = true;
  p.routed_scaling_factor = 2.5f;
  return p;
}

// Hand-checked: sigmoid scores s = σ([0, 1, -1, 2 | 1.5, -0.5, 3, -2])
//   = [.5, .7311, .2689, .8808 | .8176, .3775, .9526, .1192].
// Without the bias group 1 would win (.9526 + .8176 = 1.770 > .8808 + .7311 = 1.612); the bias
// -0.6 on experts 4 and 6 drops group 1 to .3775 + .3526 = .730, so group 0 is kept and the top-2
// are experts 3 and 1 with weights 2.5·σ(2)/(σ(2)+σ(1)) = 1.36612 and 2.5·σ(1)/(σ(2)+σ(1)) =
// 1.13388 (the unbiased scores).
TEST(MoeRoutingTest, HandCheckedGroupLimitedWithBias) {
  const std::vector<float> logits = {0, 1, -1, 2, 1.5f, -0.5f, 3, -2};
  const std::vector<float> bias = {0, 0, 0, 0, -0.6f, 0, -0.6f, 0};
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  ASSERT_TRUE(MoeRoutingCpu(logits.data(), bias.data(), 1, DeepseekTinyParams(), ids.data(),
                            w.data())
                  .ok());
  EXPECT_THAT(ids, ::testing::ElementsAre(3, 1));
  EXPECT_NEAR(w[0], 1.3661227579f, 1e-6);
  EXPECT_NEAR(w[1], 1.1338772421f, 1e-6);

  // Without the bias, group 1 wins and experts 6 and 4 are chosen.
  ASSERT_TRUE(
      MoeRoutingCpu(logits.data(), nullptr, 1, DeepseekTinyParams(), ids.data(), w.data()).ok());
  EXPECT_THAT(ids, ::testing::ElementsAre(6, 4));
}

// Softmax scoring, one group, no normalization: weights are the softmax probabilities.
TEST(MoeRoutingTest, HandCheckedSoftmaxNoNorm) {
  MoeRoutingParams p;
  p.num_experts = 4;
  p.top_k = 2;
  p.scoring = MoeScoring::kSoftmax;
  p.norm_topk_prob = false;
  p.routed_scaling_factor = 1.0f;
  const std::vector<float> logits = {0, 1, 2, 3};
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  ASSERT_TRUE(MoeRoutingCpu(logits.data(), nullptr, 1, p, ids.data(), w.data()).ok());
  EXPECT_THAT(ids, ::testing::ElementsAre(3, 2));
  EXPECT_NEAR(w[0], 0.6439142599f, 1e-6);
  EXPECT_NEAR(w[1], 0.2368828181f, 1e-6);
}

// Groups ranked by their best expert (DeepSeek-V2's group_limited_greedy) vs by their two best
// (DeepSeek-V3): softmax over [2, 2, -5, -5 | 2.5, -5, -5, -5]. Group 0's two best sum to
// 2e² (14.78) > e^2.5 (12.18), so the sum keeps group 0 (expert 0, the lower id of the tie);
// the best single score e^2.5 > e² keeps group 1 (expert 4).
TEST(MoeRoutingTest, HandCheckedGroupScoreByMaxOrTopTwoSum) {
  MoeRoutingParams p;
  p.num_experts = 8;
  p.top_k = 1;
  p.n_group = 2;
  p.topk_group = 1;
  p.scoring = MoeScoring::kSoftmax;
  p.norm_topk_prob = false;
  p.routed_scaling_factor = 1.0f;
  const std::vector<float> logits = {2, 2, -5, -5, 2.5f, -5, -5, -5};
  int32_t id = -1;
  float w = 0;
  ASSERT_TRUE(MoeRoutingCpu(logits.data(), nullptr, 1, p, &id, &w).ok());
  EXPECT_EQ(id, 0);
  p.group_score_max = true;
  ASSERT_TRUE(MoeRoutingCpu(logits.data(), nullptr, 1, p, &id, &w).ok());
  EXPECT_EQ(id, 4);
  // softmax(logits)[4] = e^2.5 / (2e² + e^2.5 + 5e^-5) = 0.451...
  double sum = 2 * std::exp(2.0) + std::exp(2.5) + 5 * std::exp(-5.0);
  EXPECT_NEAR(w, std::exp(2.5) / sum, 1e-6);
}

// transformers masks the dropped groups with 0.0, not -inf: when every kept expert has a
// negative choice score, a masked expert (score 0) is still chosen.
TEST(MoeRoutingTest, MaskedGroupsScoreZeroLikeTransformers) {
  MoeRoutingParams p = DeepseekTinyParams();
  p.top_k = 1;
  const std::vector<float> logits = {-4, -4, -4, -4, -6, -6, -6, -6};
  const std::vector<float> bias = {-0.5f, -0.5f, -0.5f, -0.5f, -0.9f, -0.9f, -0.9f, -0.9f};
  int32_t id = -1;
  float w = 0;
  ASSERT_TRUE(MoeRoutingCpu(logits.data(), bias.data(), 1, p, &id, &w).ok());
  // Group 0 is kept (choice ≈ -0.48 > -0.9) but all its experts score < 0, so the first masked
  // expert of group 1 (score 0.0) wins.
  EXPECT_EQ(id, 4);
  EXPECT_NEAR(w, 2.5f, 1e-5);  // normalized over one expert
}

TEST(MoeRoutingTest, MatchesNaiveReferenceOnRandomInputs) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  struct Case {
    int64_t experts, top_k, n_group, topk_group;
    MoeScoring scoring;
    bool norm;
    bool with_bias;
    bool group_max = false;
  };
  const std::vector<Case> cases = {
      {8, 2, 2, 1, MoeScoring::kSigmoid, true, true},
      {16, 2, 4, 2, MoeScoring::kSigmoid, true, true},
      {16, 4, 1, 1, MoeScoring::kSigmoid, true, false},
      {64, 6, 8, 3, MoeScoring::kSigmoid, true, true},
      {32, 8, 4, 4, MoeScoring::kSigmoid, false, true},
      {16, 3, 1, 1, MoeScoring::kSoftmax, false, false},
      {16, 2, 4, 2, MoeScoring::kSoftmax, true, true},
      // DeepSeek-V2's group_limited_greedy (160 experts, 8 groups, 3 kept, top-6 there).
      {160, 6, 8, 3, MoeScoring::kSoftmax, false, false, true},
      {16, 2, 4, 2, MoeScoring::kSoftmax, false, false, true},
  };
  for (const Case& c : cases) {
    MoeRoutingParams p;
    p.num_experts = c.experts;
    p.top_k = c.top_k;
    p.n_group = c.n_group;
    p.topk_group = c.topk_group;
    p.scoring = c.scoring;
    p.norm_topk_prob = c.norm;
    p.group_score_max = c.group_max;
    p.routed_scaling_factor = 2.5f;
    const int64_t tokens = 37;
    std::vector<float> logits(tokens * c.experts), bias;
    for (float& v : logits) v = normal(rng);
    if (c.with_bias) {
      bias.resize(c.experts);
      for (float& v : bias) v = 0.2f * normal(rng);
    }
    std::vector<int32_t> ids(tokens * c.top_k);
    std::vector<float> w(tokens * c.top_k);
    ASSERT_TRUE(MoeRoutingCpu(logits.data(), bias.empty() ? nullptr : bias.data(), tokens, p,
                              ids.data(), w.data())
                    .ok());
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<float> row(logits.begin() + t * c.experts, logits.begin() + (t + 1) * c.experts);
      std::vector<int32_t> ref_ids;
      std::vector<float> ref_w;
      NaiveRoute(row, bias, p, ref_ids, ref_w);
      for (int64_t k = 0; k < c.top_k; ++k) {
        ASSERT_EQ(ids[t * c.top_k + k], ref_ids[k]) << "experts " << c.experts << " token " << t;
        ASSERT_NEAR(w[t * c.top_k + k], ref_w[k], 1e-5) << "experts " << c.experts;
      }
    }
  }
}

TEST(MoeRoutingTest, RejectsInvalidParams) {
  MoeRoutingParams p = DeepseekTinyParams();
  p.n_group = 3;  // does not divide 8
  EXPECT_EQ(ValidateMoeRoutingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p = DeepseekTinyParams();
  p.top_k = 9;
  EXPECT_EQ(ValidateMoeRoutingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p = DeepseekTinyParams();
  p.top_k = 5;  // one kept group of 4 experts cannot hold 5
  EXPECT_EQ(ValidateMoeRoutingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p = DeepseekTinyParams();
  p.topk_group = 3;
  float logits[8] = {};
  int32_t ids[2];
  float w[2];
  EXPECT_EQ(MoeRoutingCpu(logits, nullptr, 1, p, ids, w).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateMoeRoutingParams(DeepseekTinyParams()).ok());
}

}  // namespace
}  // namespace sluice::kernels
