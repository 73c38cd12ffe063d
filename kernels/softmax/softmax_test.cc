#include "kernels/softmax/softmax.h"

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

namespace sluice::kernels {
namespace {

TEST(SoftmaxTest, KnownValues) {
  // scale 0.5 on [0, 2 ln 2, 2 ln 3]: exp → 1, 2, 3 (over 6).
  const float x[] = {0.0f, 2 * std::log(2.0f), 2 * std::log(3.0f),
                     // a second row, shifted by a large constant: the max keeps it finite
                     1000.0f, 1000.0f + 2 * std::log(2.0f), 1000.0f + 2 * std::log(3.0f)};
  float out[6];
  ScaledSoftmaxRowsCpu(x, 2, 3, 0.5f, out);
  for (int r = 0; r < 2; ++r) {
    // Row 1's inputs carry float32's rounding at 1000 (ulp 6e-5): looser, but finite.
    const double tol = r == 0 ? 1e-6 : 1e-4;
    EXPECT_NEAR(out[r * 3 + 0], 1.0f / 6, tol);
    EXPECT_NEAR(out[r * 3 + 1], 2.0f / 6, tol);
    EXPECT_NEAR(out[r * 3 + 2], 3.0f / 6, tol);
  }
}

TEST(SoftmaxTest, InPlaceSumsToOne) {
  std::vector<float> x(5 * 577);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 20;
  ScaledSoftmaxRowsCpu(x.data(), 5, 577, 0.125f, x.data());
  for (int r = 0; r < 5; ++r) {
    double sum = 0;
    for (int j = 0; j < 577; ++j) sum += x[r * 577 + j];
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
}

}  // namespace
}  // namespace sluice::kernels
