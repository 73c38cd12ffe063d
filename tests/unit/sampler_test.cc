// Tests for SampleToken and SamplingParams::Validate with hand-computed expectations.
#include "engine/sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "engine/sample/sampling_params.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Ids {
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  std::vector<int32_t> eos;
};

// Draws walks the positions of one seeded sequence: each call is the next token's key.
struct Draws {
  uint64_t seed = 0;
  int64_t position = 0;
  SampleDrawKey Next() { return SampleDrawKey{seed, 0, position++}; }
};

SampledToken Sample(std::vector<float> logits, const SamplingParams& params, const Ids& ids,
                    const SampleDrawKey& key) {
  SequenceContext context{ids.prompt, ids.output, ids.eos};
  return SampleToken(absl::MakeSpan(logits), params, context, key);
}

SampledToken Sample(std::vector<float> logits, const SamplingParams& params, const Ids& ids,
                    Draws& draws) {
  return Sample(std::move(logits), params, ids, draws.Next());
}

int32_t SampleId(const std::vector<float>& logits, const SamplingParams& params,
                 const Ids& ids = {}, uint64_t seed = 0) {
  return Sample(logits, params, ids, SampleDrawKey{seed, 0, 0}).token_id;
}

SamplingParams Greedy() {
  SamplingParams params;
  params.temperature = 0.0f;
  return params;
}

// The uniform number the sampler draws for SampleId(..., seed).
double FirstUniform(uint64_t seed) { return DrawUniform(SampleDrawKey{seed, 0, 0}); }

// Inverse CDF over `weights` (unnormalized, walked in index order).
int32_t InverseCdf(const std::vector<double>& weights, double u) {
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  double cumulative = 0.0;
  for (size_t i = 0; i < weights.size(); ++i) {
    cumulative += weights[i];
    if (cumulative > u * total) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(weights.size()) - 1;
}

std::vector<double> Softmax(const std::vector<double>& logits) {
  const double max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probs;
  double sum = 0.0;
  for (double l : logits) sum += std::exp(l - max);
  for (double l : logits) probs.push_back(std::exp(l - max) / sum);
  return probs;
}

// Checks that for many seeds the sampled token is the inverse-CDF draw of `weights`.
void ExpectDrawsFollow(const std::vector<float>& logits, const SamplingParams& params,
                       const Ids& ids, const std::vector<double>& weights) {
  for (uint64_t seed = 0; seed < 400; ++seed) {
    ASSERT_EQ(SampleId(logits, params, ids, seed), InverseCdf(weights, FirstUniform(seed)))
        << "seed " << seed;
  }
}

TEST(SamplerTest, GreedyPicksArgmaxLowestIdOnTies) {
  EXPECT_EQ(SampleId({0.1f, 2.5f, -1.0f, 2.4f}, Greedy()), 1);
  EXPECT_EQ(SampleId({1.0f, 3.0f, 3.0f, 2.0f}, Greedy()), 1);
  EXPECT_EQ(SampleId({-kInf, -kInf, -kInf}, Greedy()), 0);
  EXPECT_EQ(SampleId({std::nanf(""), -5.0f, -4.0f}, Greedy()), 2);
}

TEST(SamplerTest, GreedyIgnoresTheDrawKey) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    ASSERT_EQ(Sample({0.7f, 0.1f, 0.69f}, Greedy(), {}, SampleDrawKey{seed, 3, 17}).token_id, 0);
  }
}

// The key is the whole state: the same (seed, choice, position) gives the same token whatever
// was drawn before, and any component changes the draw.
TEST(SamplerTest, DrawDependsOnlyOnItsKey) {
  std::vector<float> logits(64);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 0.05f * static_cast<float>(i % 7);
  const SamplingParams params;  // T = 1, no filtering
  const SampleDrawKey key{99, 2, 40};
  const int32_t alone = Sample(logits, params, {}, key).token_id;
  Draws other{5};
  for (int i = 0; i < 37; ++i) Sample(logits, params, {}, other);  // unrelated draws between
  EXPECT_EQ(Sample(logits, params, {}, key).token_id, alone);
  int changed_seed = 0, changed_choice = 0, changed_position = 0;
  for (uint32_t i = 1; i <= 100; ++i) {
    changed_seed += Sample(logits, params, {}, {99 + i, 2, 40}).token_id != alone;
    changed_choice += Sample(logits, params, {}, {99, 2 + i, 40}).token_id != alone;
    changed_position += Sample(logits, params, {}, {99, 2, 40 + i}).token_id != alone;
  }
  // 64 near-uniform candidates: a changed key picks the same token ~1/64 of the time.
  EXPECT_GT(changed_seed, 85);
  EXPECT_GT(changed_choice, 85);
  EXPECT_GT(changed_position, 85);
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplingParams params = Greedy();
  params.repetition_penalty = 2.0f;
  // Positive: 3.0 / 2 = 1.5 < 1.6.
  EXPECT_EQ(SampleId({3.0f, 1.6f}, params, {.prompt = {0}}), 1);
  // 1.5 > 1.4; applied once although token 0 occurs three times (0.75 would pick 1).
  EXPECT_EQ(SampleId({3.0f, 1.4f}, params, {.prompt = {0, 0}, .output = {0}}), 0);
  // Negative: -1.0 * 2 = -2.0 < -1.9; output tokens count too.
  EXPECT_EQ(SampleId({-1.0f, -1.9f}, params, {.output = {0}}), 1);
  params.repetition_penalty = 1.8f;  // -1.8 > -1.9
  EXPECT_EQ(SampleId({-1.0f, -1.9f}, params, {.output = {0}}), 0);
  // Unseen tokens are untouched.
  params.repetition_penalty = 2.0f;
  EXPECT_EQ(SampleId({3.0f, 1.6f}, params, {.prompt = {1}}), 0);
}

TEST(SamplerTest, PresencePenaltyCountsOutputOnce) {
  SamplingParams params = Greedy();
  params.presence_penalty = 0.2f;  // 2.0 - 0.2 = 1.8 < 1.9
  EXPECT_EQ(SampleId({2.0f, 1.9f}, params, {.output = {0}}), 1);
  params.presence_penalty = 0.05f;  // 1.95 > 1.9 regardless of count
  EXPECT_EQ(SampleId({2.0f, 1.9f}, params, {.output = {0, 0, 0}}), 0);
  // Prompt tokens are not penalized.
  params.presence_penalty = 2.0f;
  EXPECT_EQ(SampleId({2.0f, 1.9f}, params, {.prompt = {0}}), 0);
  // Negative presence encourages repeats: 1.0 + 1.0 = 2.0 > 1.5.
  params.presence_penalty = -1.0f;
  EXPECT_EQ(SampleId({1.0f, 1.5f}, params, {.output = {0}}), 0);
}

TEST(SamplerTest, FrequencyPenaltyScalesWithCount) {
  SamplingParams params = Greedy();
  params.frequency_penalty = 0.05f;
  EXPECT_EQ(SampleId({2.0f, 1.9f}, params, {.output = {0}}), 0);        // 1.95
  EXPECT_EQ(SampleId({2.0f, 1.9f}, params, {.output = {0, 0, 0}}), 1);  // 1.85
  EXPECT_EQ(SampleId({2.0f, 1.9f}, params, {.prompt = {0, 0, 0}}), 0);  // prompt ignored
}

TEST(SamplerTest, CombinedPenaltiesMatchHandComputedDistribution) {
  SamplingParams params;
  params.temperature = 1.0f;
  params.repetition_penalty = 1.5f;
  params.frequency_penalty = 0.5f;
  params.presence_penalty = 0.25f;
  const Ids ids{.prompt = {0}, .output = {2, 2, 3}};
  // token 0: 1.0 / 1.5; token 1 untouched; token 2: -1.0 * 1.5 - 2 * 0.5 - 0.25;
  // token 3: 0.5 / 1.5 - 0.5 - 0.25.
  const std::vector<double> penalized = {2.0 / 3.0, 2.0, -2.75, -5.0 / 12.0};
  ExpectDrawsFollow({1.0f, 2.0f, -1.0f, 0.5f}, params, ids, Softmax(penalized));
}

TEST(SamplerTest, MinTokensSuppressesEosAndStopIds) {
  SamplingParams params = Greedy();
  params.min_tokens = 2;
  const std::vector<float> logits = {5.0f, 4.0f, 1.0f};
  EXPECT_EQ(SampleId(logits, params, {.output = {7}, .eos = {0}}), 1);
  EXPECT_EQ(SampleId(logits, params, {.output = {7}, .eos = {0, 1}}), 2);
  EXPECT_EQ(SampleId(logits, params, {.output = {7, 7}, .eos = {0, 1}}), 0);
  params.min_tokens = 0;
  EXPECT_EQ(SampleId(logits, params, {.eos = {0}}), 0);

  // Random sampling never draws a suppressed id.
  params.temperature = 1.0f;
  params.min_tokens = 1;
  Draws draws{3};
  for (int i = 0; i < 2000; ++i) {
    ASSERT_NE(Sample({1.0f, 1.0f, 1.0f}, params, {.eos = {1}}, draws).token_id, 1);
  }
}

TEST(SamplerTest, TopKOneEqualsGreedy) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  SamplingParams params;
  params.top_k = 1;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    std::vector<float> logits(1000);
    for (float& l : logits) l = normal(gen);
    if (seed % 2 == 0) {  // a tie at the maximum: the lower id wins, as in greedy
      const auto max_it = std::max_element(logits.begin(), logits.end());
      logits[(max_it - logits.begin() + 500) % 1000] = *max_it;
    }
    ASSERT_EQ(SampleId(logits, params, {}, seed), SampleId(logits, Greedy())) << seed;
  }
}

TEST(SamplerTest, TinyTopPKeepsOnlyTheMax) {
  SamplingParams params;
  params.top_p = 1e-6f;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    ASSERT_EQ(SampleId({0.5f, 0.4f, 0.6f, 0.59f}, params, {}, seed), 2);
  }
}

// Probabilities 0.5, 0.3, 0.15, 0.05 (descending by id, so walk orders coincide).
std::vector<float> FourTokenLogits() {
  return {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
}

TEST(SamplerTest, TopPKeepsSmallestPrefixReachingP) {
  SamplingParams params;
  params.top_p = 0.75f;  // 0.5 < 0.75 <= 0.8
  ExpectDrawsFollow(FourTokenLogits(), params, {}, {0.5, 0.3, 0.0, 0.0});
  params.top_p = 0.85f;  // 0.8 < 0.85 <= 0.95
  ExpectDrawsFollow(FourTokenLogits(), params, {}, {0.5, 0.3, 0.15, 0.0});
}

TEST(SamplerTest, TopKRestrictsToKBest) {
  SamplingParams params;
  params.top_k = 2;
  ExpectDrawsFollow(FourTokenLogits(), params, {}, {0.5, 0.3, 0.0, 0.0});
  params.top_k = 4;  // = vocab: disabled
  ExpectDrawsFollow(FourTokenLogits(), params, {}, {0.5, 0.3, 0.15, 0.05});
}

TEST(SamplerTest, TopPAppliesAfterTopKRenormalization) {
  SamplingParams params;
  params.top_k = 3;      // 0.5, 0.3, 0.15 → renormalized 0.526, 0.316, 0.158
  params.top_p = 0.82f;  // 0.526 < 0.82 <= 0.842; without renormalization 0.8 < 0.82 keeps 3
  ExpectDrawsFollow(FourTokenLogits(), params, {}, {0.5, 0.3, 0.0, 0.0});
}

TEST(SamplerTest, MinPDropsTokensBelowFractionOfMax) {
  SamplingParams params;
  params.min_p = 0.2f;  // threshold 0.1: drops 0.05
  ExpectDrawsFollow(FourTokenLogits(), params, {}, {0.5, 0.3, 0.15, 0.0});
  params.min_p = 0.5f;  // threshold 0.25: keeps 0.5 and 0.3
  ExpectDrawsFollow(FourTokenLogits(), params, {}, {0.5, 0.3, 0.0, 0.0});
}

TEST(SamplerTest, TemperatureSharpensDistribution) {
  SamplingParams params;
  params.temperature = 0.5f;  // p^(1/T) = p^2
  ExpectDrawsFollow(FourTokenLogits(), params, {}, {0.25, 0.09, 0.0225, 0.0025});
}

// Reference for top_p on a large vocabulary: full sort, then the inverse CDF in rank order.
TEST(SamplerTest, TopPOnLargeVocabMatchesFullSortReference) {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(5000);
  for (float& l : logits) l = normal(gen);
  SamplingParams params;
  params.temperature = 0.7f;
  params.top_p = 0.9f;

  std::vector<float> scaled = logits;
  for (float& l : scaled) l /= params.temperature;
  std::vector<int32_t> order(scaled.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return scaled[a] > scaled[b] || (scaled[a] == scaled[b] && a < b);
  });
  const double max = scaled[order[0]];
  double total = 0.0;
  for (float l : scaled) total += std::exp(static_cast<double>(l) - max);
  std::vector<double> kept;
  double mass = 0.0;
  for (int32_t id : order) {
    kept.push_back(std::exp(static_cast<double>(scaled[id]) - max));
    mass += kept.back();
    if (mass >= 0.9 * total) break;
  }
  ASSERT_GT(kept.size(), 64u);  // exercises the growing sorted prefix
  ASSERT_LT(kept.size(), 4000u);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    ASSERT_EQ(SampleId(logits, params, {}, seed), order[InverseCdf(kept, FirstUniform(seed))])
        << seed;
  }
}

TEST(SamplerTest, SameSeedSameSequenceDifferentSeedsDiffer) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 0.01f * static_cast<float>(i);
  SamplingParams params;
  params.top_k = 40;
  params.top_p = 0.95f;
  auto run = [&](uint64_t seed) {
    Draws draws{seed};
    std::vector<int32_t> tokens;
    for (int i = 0; i < 100; ++i) tokens.push_back(Sample(logits, params, {}, draws).token_id);
    return tokens;
  };
  EXPECT_EQ(run(42), run(42));
  const std::vector<int32_t> a = run(1);
  const std::vector<int32_t> b = run(2);
  int differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += a[i] != b[i];
  EXPECT_GT(differing, 80);
}

TEST(SamplerTest, EmpiricalDistributionMatchesSoftmax) {
  const std::vector<float> logits = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f};
  const std::vector<double> expected = Softmax({1.0, 0.5, -0.3, 2.0, 0.0});
  SamplingParams params;  // T = 1, no filtering
  Draws draws{1234};
  constexpr int kDraws = 20000;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < kDraws; ++i) ++counts[Sample(logits, params, {}, draws).token_id];
  for (size_t i = 0; i < logits.size(); ++i) {
    EXPECT_NEAR(static_cast<double>(counts[i]) / kDraws, expected[i], 0.01) << "token " << i;
  }
}

TEST(SamplerTest, LogprobsAreRawLogSoftmaxWithOrderedTop) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l));
  auto log_softmax = [&](int32_t id) { return logits[id] - std::log(sum); };

  SamplingParams params = Greedy();
  params.repetition_penalty = 3.0f;  // processing must not leak into logprobs
  params.logprobs = 3;
  Draws draws{0};
  const SampledToken token = Sample(logits, params, {.prompt = {1}}, draws);
  EXPECT_EQ(token.token_id, 2);  // 3.0 / 3 = 1.0 for token 1
  EXPECT_NEAR(token.logprob, log_softmax(2), 1e-6);
  ASSERT_EQ(token.top_logprobs.size(), 3u);
  EXPECT_EQ(token.top_logprobs[0].token_id, 1);
  EXPECT_EQ(token.top_logprobs[1].token_id, 2);
  EXPECT_EQ(token.top_logprobs[2].token_id, 0);
  for (const TokenLogprob& entry : token.top_logprobs) {
    EXPECT_NEAR(entry.logprob, log_softmax(entry.token_id), 1e-6);
  }

  params.temperature = 0.3f;
  params.logprobs = 0;
  const SampledToken sampled = Sample(logits, params, {}, draws);
  EXPECT_NEAR(sampled.logprob, log_softmax(sampled.token_id), 1e-6);
  EXPECT_TRUE(sampled.top_logprobs.empty());

  params.logprobs = 20;  // more than the vocabulary: all of it
  EXPECT_EQ(Sample(logits, params, {}, draws).top_logprobs.size(), logits.size());
}

// --- SamplingParams::Validate ---------------------------------------------------------------

void ExpectInvalid(const SamplingParams& params, const std::string& message) {
  const absl::Status status = params.Validate(/*vocab_size=*/10);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << message;
  EXPECT_EQ(status.message(), message);
}

TEST(SamplingParamsTest, AcceptsDefaultsAndBoundaries) {
  EXPECT_TRUE(SamplingParams().Validate(10).ok());
  SamplingParams params;
  params.temperature = 0.0f;
  params.top_p = 1.0f;
  params.top_k = 0;
  params.min_p = 1.0f;
  params.presence_penalty = -2.0f;
  params.frequency_penalty = 2.0f;
  params.repetition_penalty = 0.01f;
  params.max_tokens = 1;
  params.min_tokens = 1;
  params.logprobs = 20;
  params.stop_token_ids = {0, 9};
  EXPECT_TRUE(params.Validate(10).ok());
  params.top_k = 1;
  params.temperature = 100.0f;
  params.logprobs = 0;
  EXPECT_TRUE(params.Validate(10).ok());
}

TEST(SamplingParamsTest, RejectsEachFieldWithItsName) {
  SamplingParams params;
  params.temperature = -0.5f;
  ExpectInvalid(params, "temperature must be in [0, 100], got -0.5");
  params.temperature = std::nanf("");
  ExpectInvalid(params, "temperature must be in [0, 100], got nan");

  params = {};
  params.top_p = 0.0f;
  ExpectInvalid(params, "top_p must be in (0, 1], got 0");
  params.top_p = 1.5f;
  ExpectInvalid(params, "top_p must be in (0, 1], got 1.5");

  params = {};
  params.top_k = -2;
  ExpectInvalid(params, "top_k must be -1 or 0 (disabled) or >= 1, got -2");

  params = {};
  params.min_p = 1.5f;
  ExpectInvalid(params, "min_p must be in [0, 1], got 1.5");

  params = {};
  params.presence_penalty = 2.5f;
  ExpectInvalid(params, "presence_penalty must be in [-2, 2], got 2.5");

  params = {};
  params.frequency_penalty = -3.0f;
  ExpectInvalid(params, "frequency_penalty must be in [-2, 2], got -3");

  params = {};
  params.repetition_penalty = 0.0f;
  ExpectInvalid(params, "repetition_penalty must be in (0, inf), got 0");

  params = {};
  params.max_tokens = 0;
  ExpectInvalid(params, "max_tokens must be >= 1, got 0");

  params = {};
  params.max_tokens = 4;
  params.min_tokens = 5;
  ExpectInvalid(params, "min_tokens must be in [0, max_tokens=4], got 5");
  params.min_tokens = -1;
  ExpectInvalid(params, "min_tokens must be in [0, max_tokens=4], got -1");

  params = {};
  params.logprobs = 21;
  ExpectInvalid(params, "logprobs must be in [0, 20], got 21");

  params = {};
  params.stop_token_ids = {3, 10};
  ExpectInvalid(params, "stop_token_ids must be in [0, vocab_size=10), got 10");
  params.stop_token_ids = {-1};
  ExpectInvalid(params, "stop_token_ids must be in [0, vocab_size=10), got -1");
}

}  // namespace
}  // namespace sluice
