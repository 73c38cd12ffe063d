// Tests for the CPU sampling reference (SampleRowCpu / SampleRowsCpu) with hand-computed
// distributions. Equality with engine/sample SampleToken is tested in
// tests/unit/device_sampling_test.cc.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sampling/sampling.h"

namespace sluice::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

SamplingRow Row(float temperature, double uniform, int32_t top_k = 0, float top_p = 1.0f,
                float min_p = 0.0f) {
  SamplingRow row;
  row.temperature = temperature;
  row.top_k = top_k;
  row.top_p = top_p;
  row.min_p = min_p;
  row.uniform = uniform;
  return row;
}

// Probabilities 0.25, 0.5, 0.25.
const std::vector<float> kQuarterHalfQuarter = {0.0f, std::log(2.0f), 0.0f};

int32_t Token(const std::vector<float>& logits, const SamplingRow& row) {
  return SampleRowCpu(logits.data(), static_cast<int64_t>(logits.size()), row).token;
}

TEST(SampleRowCpuTest, GreedyTakesLowestIdOfTheMaximumAndRawLogprob) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -kInf};
  const SampleRowResult r = SampleRowCpu(logits.data(), 4, Row(0.0f, 0.99));
  EXPECT_EQ(r.token, 1);
  const double lse = std::log(std::exp(1.0) + 2 * std::exp(3.0));
  EXPECT_NEAR(r.logprob, 3.0 - lse, 1e-6);
  EXPECT_TRUE(std::isinf(r.margin));
  EXPECT_EQ(Token(logits, Row(9e-6f, 0.5)), 1);  // below vLLM's 1e-5: greedy
}

TEST(SampleRowCpuTest, AllNegativeInfinityRowGivesTokenZeroAndNanLogprob) {
  const std::vector<float> logits(5, -kInf);
  for (const SamplingRow& row : {Row(0.0f, 0.5), Row(1.0f, 0.5, 2, 0.5f, 0.1f)}) {
    const SampleRowResult r = SampleRowCpu(logits.data(), 5, row);
    EXPECT_EQ(r.token, 0);
    EXPECT_TRUE(std::isnan(r.logprob));
  }
}

TEST(SampleRowCpuTest, UnsortedDrawWalksAscendingIds) {
  EXPECT_EQ(Token(kQuarterHalfQuarter, Row(1.0f, 0.2)), 0);
  EXPECT_EQ(Token(kQuarterHalfQuarter, Row(1.0f, 0.3)), 1);
  EXPECT_EQ(Token(kQuarterHalfQuarter, Row(1.0f, 0.8)), 2);
  const SampleRowResult r = SampleRowCpu(kQuarterHalfQuarter.data(), 3, Row(1.0f, 0.3));
  EXPECT_NEAR(r.margin, 0.05, 1e-8);  // cumulative 0.25 | 0.75 around target 0.3
  EXPECT_NEAR(r.logprob, std::log(0.5), 1e-6);
}

TEST(SampleRowCpuTest, TopKDrawsInRankOrder) {
  // top_k = 2 of 3 keeps ids 1 (0.5) and 0 (0.25, tie with 2 → lower id), kept mass 0.75:
  // rank order 1, 0; u = 0.7 → target 0.525 > 0.5 → id 0.
  EXPECT_EQ(Token(kQuarterHalfQuarter, Row(1.0f, 0.7, 2)), 0);
  EXPECT_EQ(Token(kQuarterHalfQuarter, Row(1.0f, 0.6, 2)), 1);
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(Token(kQuarterHalfQuarter, Row(1.0f, u, 1)), 1);
  // top_k >= vocab is off: the ascending-id draw.
  EXPECT_EQ(Token(kQuarterHalfQuarter, Row(1.0f, 0.2, 3)), 0);
}

TEST(SampleRowCpuTest, TopPKeepsTheShortestRankPrefixReachingTheMass) {
  // 0.5 reaches top_p 0.5 alone.
  EXPECT_EQ(Token(kQuarterHalfQuarter, Row(1.0f, 0.99, 0, 0.5f)), 1);
  // top_p 0.6 needs ids 1 and 0 (0.75); u = 0.7 → target 0.525 → id 0; id 2 never drawn.
  EXPECT_EQ(Token(kQuarterHalfQuarter, Row(1.0f, 0.7, 0, 0.6f)), 0);
  EXPECT_EQ(Token(kQuarterHalfQuarter, Row(1.0f, 0.999, 0, 0.6f)), 0);
  const SampleRowResult r = SampleRowCpu(kQuarterHalfQuarter.data(), 3, Row(1.0f, 0.7, 0, 0.6f));
  // Top_p cut: |0.75 - 0.6| vs |0.6 - 0.5| → 0.1; draw: |0.525 - 0.5| / 0.75 = 1/30.
  EXPECT_NEAR(r.margin, 0.025 / 0.75, 1e-8);
}

TEST(SampleRowCpuTest, MinPDropsTokensBelowTheFractionOfTheBest) {
  // p_max 0.5; min_p 0.6 drops p < 0.3: only id 1 is left.
  for (double u : {0.0, 0.4, 0.99}) {
    EXPECT_EQ(Token(kQuarterHalfQuarter, Row(1.0f, u, 0, 1.0f, 0.6f)), 1);
  }
  // min_p 0.45 keeps p >= 0.225: all three.
  EXPECT_EQ(Token(kQuarterHalfQuarter, Row(1.0f, 0.9, 0, 1.0f, 0.45f)), 2);
}

TEST(SampleRowCpuTest, TemperatureScalesBeforeTheDrawButNotTheLogprob) {
  // {0, log 2} / 0.5 → probabilities 1/5, 4/5.
  const std::vector<float> logits = {0.0f, std::log(2.0f)};
  EXPECT_EQ(Token(logits, Row(0.5f, 0.19)), 0);
  const SampleRowResult r = SampleRowCpu(logits.data(), 2, Row(0.5f, 0.21));
  EXPECT_EQ(r.token, 1);
  EXPECT_NEAR(r.logprob, std::log(2.0 / 3.0), 1e-6);
}

TEST(SampleRowsCpuTest, SamplesEachRowWithItsOwnParams) {
  const std::vector<float> logits = {0.0f, std::log(2.0f), 0.0f, 5.0f, 1.0f, 0.0f};
  const SamplingRow params[2] = {Row(1.0f, 0.8), Row(0.0f, 0.8)};
  int32_t tokens[2] = {-1, -1};
  float logprobs[2] = {0.0f, 0.0f};
  SampleRowsCpu(logits.data(), 2, 3, params, tokens, logprobs);
  EXPECT_EQ(tokens[0], 2);
  EXPECT_EQ(tokens[1], 0);
  EXPECT_NEAR(logprobs[0], std::log(0.25), 1e-6);
  EXPECT_NEAR(logprobs[1], 5.0 - std::log(std::exp(5.0) + std::exp(1.0) + 1.0), 1e-6);
}

}  // namespace
}  // namespace sluice::kernels
