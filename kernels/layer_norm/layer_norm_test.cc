#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/layer_norm/layer_norm.h"

namespace sluice::kernels {
namespace {

TEST(LayerNormTest, KnownValues) {
  // Row [1, 2, 3, 4]: mean 2.5, biased var 1.25.
  const float x[] = {1, 2, 3, 4};
  const float w[] = {1, 2, 1, 1};
  const float b[] = {0, 0, 0.5f, 0};
  float out[4];
  LayerNormCpu(x, w, b, out, 1, 4, 0.0f);
  const float s = 1.0f / std::sqrt(1.25f);
  EXPECT_NEAR(out[0], -1.5f * s, 1e-6);
  EXPECT_NEAR(out[1], 2 * -0.5f * s, 1e-6);
  EXPECT_NEAR(out[2], 0.5f * s + 0.5f, 1e-6);
  EXPECT_NEAR(out[3], 1.5f * s, 1e-6);
}

TEST(LayerNormTest, MatchesReferenceInPlace) {
  const int64_t rows = 9, dim = 37;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(1, 3);
  std::vector<float> x(rows * dim), w(dim), b(dim);
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = dist(rng);
  for (float& v : b) v = dist(rng);
  std::vector<float> out = x;
  LayerNormCpu(out.data(), w.data(), b.data(), out.data(), rows, dim, 1e-5f);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < dim; ++i) mean += x[r * dim + i];
    mean /= dim;
    for (int64_t i = 0; i < dim; ++i) var += (x[r * dim + i] - mean) * (x[r * dim + i] - mean);
    var /= dim;
    for (int64_t i = 0; i < dim; ++i) {
      const double ref = (x[r * dim + i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i];
      EXPECT_NEAR(out[r * dim + i], ref, 1e-5 * (1 + std::fabs(ref)));
    }
  }
}

TEST(LayerNormTest, AddLayerNormAddsThenNormalizes) {
  // h = [0, 1, 2, 3] + [1, 1, 1, 1] = [1, 2, 3, 4]: the KnownValues row.
  float h[] = {0, 1, 2, 3};
  const float delta[] = {1, 1, 1, 1};
  const float w[] = {1, 2, 1, 1};
  const float b[] = {0, 0, 0.5f, 0};
  float out[4];
  AddLayerNormCpu(h, delta, w, b, out, 1, 4, 0.0f);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[3], 4.0f);
  const float s = 1.0f / std::sqrt(1.25f);
  EXPECT_NEAR(out[0], -1.5f * s, 1e-6);
  EXPECT_NEAR(out[2], 0.5f * s + 0.5f, 1e-6);
  // No output: the add alone. No delta: the norm alone.
  AddLayerNormCpu(h, delta, w, b, nullptr, 1, 4, 0.0f);
  EXPECT_EQ(h[1], 3.0f);
  float out2[4];
  AddLayerNormCpu(h, nullptr, w, b, out2, 1, 4, 0.0f);
  EXPECT_EQ(h[1], 3.0f);
  EXPECT_NEAR(out2[0], -1.5f * s, 1e-6);  // [2, 3, 4, 5]: same centered row
}

}  // namespace
}  // namespace sluice::kernels
