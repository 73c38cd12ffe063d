// The device sampler's CPU reference (kernels/sampling SampleRowCpu) against the engine's
// SampleToken: for rows without penalties, min_tokens or top logprobs, the row DeviceSamplingRow
// builds for a draw key (its uniform is SampleToken's draw) must give the same token and logprob.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"
#include "gtest/gtest.h"
#include "kernels/sampling/sampling.h"

namespace sluice {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Random row: peaked (wide spread), flat, or with ties and -inf entries.
std::vector<float> RandomLogits(int64_t vocab, int kind, std::mt19937_64& gen) {
  std::vector<float> logits(vocab);
  std::normal_distribution<float> normal(0.0f, kind == 0 ? 4.0f : 0.5f);
  for (float& v : logits) v = normal(gen);
  if (kind == 2) {
    std::uniform_int_distribution<int> level(0, 3);
    for (float& v : logits) v = static_cast<float>(level(gen));  // many ties
    for (int64_t i = 0; i < vocab; i += 7) logits[i] = -kInf;
  }
  return logits;
}

TEST(DeviceSamplingReferenceTest, MatchesSampleTokenWithTheSameDraw) {
  std::mt19937_64 gen(20261129);
  const float temperatures[] = {0.0f, 0.7f, 1.0f, 1.3f};
  const int32_t top_ks[] = {-1, 0, 1, 5, 50};
  const float top_ps[] = {1.0f, 0.9f, 0.5f, 0.05f};
  const float min_ps[] = {0.0f, 0.05f, 0.3f};
  int sampled_rows = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int64_t vocab = trial % 3 == 0 ? 7 : (trial % 3 == 1 ? 100 : 2000);
    const std::vector<float> logits = RandomLogits(vocab, trial % 3, gen);
    SamplingParams params;
    params.temperature = temperatures[gen() % 4];
    params.top_k = top_ks[gen() % 5];
    params.top_p = top_ps[gen() % 4];
    params.min_p = min_ps[gen() % 3];
    const SampleDrawKey key{gen(), static_cast<uint32_t>(gen() % 4),
                            static_cast<int64_t>(gen() % 100000)};

    std::vector<float> scratch = logits;
    const SampledToken want =
        SampleToken(absl::MakeSpan(scratch), params, SequenceContext{}, key);

    const kernels::SamplingRow row = DeviceSamplingRow(params, key);
    const kernels::SampleRowResult got = kernels::SampleRowCpu(logits.data(), vocab, row);

    EXPECT_EQ(got.token, want.token_id)
        << "trial " << trial << " T " << params.temperature << " top_k " << params.top_k
        << " top_p " << params.top_p << " min_p " << params.min_p << " u " << row.uniform;
    EXPECT_FLOAT_EQ(got.logprob, want.logprob) << "trial " << trial;
    if (params.temperature > 0.0f) ++sampled_rows;
  }
  EXPECT_GT(sampled_rows, 300);
}

TEST(DeviceSamplingReferenceTest, RowCarriesTheTokenDraw) {
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_k = 7;
  const SampleDrawKey key{7, 1, 12};
  const kernels::SamplingRow row = DeviceSamplingRow(params, key);
  EXPECT_EQ(row.uniform, DrawUniform(key, kTokenDraw));
  EXPECT_EQ(row.temperature, 0.8f);
  EXPECT_EQ(row.top_k, 7);
  params.temperature = 0.0f;  // greedy rows carry no draw
  EXPECT_EQ(DeviceSamplingRow(params, key).uniform, 0.0);
  EXPECT_EQ(DeviceSamplingRow(params, key).temperature, 0.0f);
}

}  // namespace
}  // namespace sluice
