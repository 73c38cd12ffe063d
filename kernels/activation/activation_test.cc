#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/activation/activation.h"

namespace sluice::kernels {
namespace {

TEST(SiluMulTest, MatchesReference) {
  for (int64_t d : {1, 5, 64, 161}) {
    const int64_t rows = 7;
    std::mt19937 rng(static_cast<uint32_t>(d));
    std::normal_distribution<float> dist(0, 3);
    std::vector<float> gu(static_cast<size_t>(rows * 2 * d));
    for (float& v : gu) v = dist(rng);
    std::vector<float> out(static_cast<size_t>(rows * d));
    SiluMulCpu(gu.data(), out.data(), rows, d);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < d; ++i) {
        const double g = gu[r * 2 * d + i], u = gu[r * 2 * d + d + i];
        const double ref = g / (1.0 + std::exp(-g)) * u;
        EXPECT_NEAR(out[r * d + i], ref, 1e-5 * (1 + std::fabs(ref)));
      }
    }
  }
}

TEST(SiluMulTest, KnownValues) {
  // silu(0) = 0, silu(large) ≈ x, silu(-large) ≈ 0.
  const float gu[] = {0.0f, 30.0f, -30.0f, 2.0f, 5.0f, 1.0f};
  float out[3];
  SiluMulCpu(gu, out, 1, 3);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 30.0f * 5.0f, 1e-4);
  EXPECT_NEAR(out[2], 0.0f, 1e-10);
}

TEST(GeluTest, MatchesErfAndSigmoidForms) {
  std::vector<float> x;
  for (int i = -40; i <= 40; ++i) x.push_back(0.25f * static_cast<float>(i));
  std::vector<float> gelu(x.size()), quick(x.size());
  GeluCpu(x.data(), gelu.data(), static_cast<int64_t>(x.size()));
  QuickGeluCpu(x.data(), quick.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double ref = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    const double qref = v / (1.0 + std::exp(-1.702 * v));
    EXPECT_NEAR(gelu[i], ref, 1e-6 * (1 + std::fabs(ref)));
    EXPECT_NEAR(quick[i], qref, 1e-6 * (1 + std::fabs(qref)));
  }
  // GELU(1) = Φ(1) = 0.8413447...; quick GELU differs from it in the third decimal.
  EXPECT_NEAR(gelu[44], 0.8413447f, 1e-6);
  EXPECT_NEAR(quick[44], 0.8457958f, 1e-6);
}

}  // namespace
}  // namespace sluice::kernels
