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

}  // namespace
}  // namespace sluice::kernels
