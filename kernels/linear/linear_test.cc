#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/linear/linear.h"

namespace sluice::kernels {
namespace {

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Naive double-precision reference.
std::vector<double> Reference(const std::vector<float>& x, const std::vector<float>& w,
                              const float* bias, int64_t m, int64_t n, int64_t k) {
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = bias ? bias[j] : 0.0;
      for (int64_t t = 0; t < k; ++t) s += double{x[i * k + t]} * double{w[j * k + t]};
      y[i * n + j] = s;
    }
  }
  return y;
}

struct Shape {
  int64_t m, n, k;
};

class LinearShapeTest : public ::testing::TestWithParam<Shape> {};

TEST_P(LinearShapeTest, MatchesReference) {
  const Shape s = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(s.m * 1000003 + s.n * 101 + s.k));
  auto x = Random(static_cast<size_t>(s.m * s.k), rng);
  auto w = Random(static_cast<size_t>(s.n * s.k), rng);
  auto bias = Random(static_cast<size_t>(s.n), rng);
  for (bool with_bias : {false, true}) {
    std::vector<float> y(static_cast<size_t>(s.m * s.n), -1.0f);
    LinearCpu(x.data(), w.data(), with_bias ? bias.data() : nullptr, y.data(), s.m, s.n, s.k);
    auto ref = Reference(x, w, with_bias ? bias.data() : nullptr, s.m, s.n, s.k);
    for (size_t i = 0; i < y.size(); ++i) {
      // |error| of a float32 dot product of N(0,1) terms: a few ulps of sqrt(k).
      ASSERT_NEAR(y[i], ref[i], 2e-6 * s.k + 1e-5) << "index " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearShapeTest,
                         ::testing::Values(Shape{1, 1, 1}, Shape{1, 7, 5}, Shape{1, 64, 64},
                                           Shape{1, 67, 33}, Shape{3, 5, 17}, Shape{4, 8, 16},
                                           Shape{5, 9, 31}, Shape{37, 130, 100},
                                           Shape{64, 256, 256}, Shape{2, 1000, 48}));

// Batch invariance: every row of a 37-row product equals, bit for bit, the same row computed
// alone (m = 1) and inside batches of other sizes.
TEST(LinearTest, BatchInvariant) {
  for (int64_t k : {16, 64, 100, 257}) {
    const int64_t m = 37, n = 75;
    std::mt19937 rng(static_cast<uint32_t>(k));
    auto x = Random(static_cast<size_t>(m * k), rng);
    auto w = Random(static_cast<size_t>(n * k), rng);
    auto bias = Random(static_cast<size_t>(n), rng);
    std::vector<float> full(static_cast<size_t>(m * n));
    LinearCpu(x.data(), w.data(), bias.data(), full.data(), m, n, k);
    for (int64_t i = 0; i < m; ++i) {
      std::vector<float> one(static_cast<size_t>(n));
      LinearCpu(x.data() + i * k, w.data(), bias.data(), one.data(), 1, n, k);
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(one[j], full[i * n + j]) << "k=" << k << " row " << i << " col " << j;
      }
    }
    for (int64_t sub : {2, 3, 4, 5, 6, 7, 8, 13}) {
      std::vector<float> part(static_cast<size_t>(sub * n));
      LinearCpu(x.data() + 11 * k, w.data(), bias.data(), part.data(), sub, n, k);
      for (int64_t i = 0; i < sub; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(part[i * n + j], full[(11 + i) * n + j]) << "m=" << sub;
        }
      }
    }
  }
}

// The n-split across threads must not change results: a column subset computed with a
// different n gives the same bits.
TEST(LinearTest, ColumnSubsetIdentical) {
  const int64_t m = 9, n = 300, k = 96;
  std::mt19937 rng(7);
  auto x = Random(static_cast<size_t>(m * k), rng);
  auto w = Random(static_cast<size_t>(n * k), rng);
  std::vector<float> full(static_cast<size_t>(m * n));
  LinearCpu(x.data(), w.data(), nullptr, full.data(), m, n, k);
  const int64_t j0 = 13, nn = 5;
  std::vector<float> sub(static_cast<size_t>(m * nn));
  LinearCpu(x.data(), w.data() + j0 * k, nullptr, sub.data(), m, nn, k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < nn; ++j) ASSERT_EQ(sub[i * nn + j], full[i * n + j0 + j]);
  }
}

TEST(LinearTest, ExactSmallIntegers) {
  // x = [[1, 2, 3]], w = [[1, 0, 0], [0, 1, 0], [1, 1, 1]], bias = [0.5, 0, -6]
  const float x[] = {1, 2, 3};
  const float w[] = {1, 0, 0, 0, 1, 0, 1, 1, 1};
  const float bias[] = {0.5f, 0, -6};
  float y[3];
  LinearCpu(x, w, bias, y, 1, 3, 3);
  EXPECT_EQ(y[0], 1.5f);
  EXPECT_EQ(y[1], 2.0f);
  EXPECT_EQ(y[2], 0.0f);
}

// bfloat16 weights: the same bits as float32 weights holding the same (bf16) values, for the
// few-row path (m <= 8), the row blocks, odd n and a k % 16 tail; ToBf16 rounds to nearest even.
TEST(LinearTest, Bf16WeightsMatchFloatWeightsOfTheSameValues) {
  EXPECT_EQ(ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(ToBf16(-2.0f), 0xc000);
  EXPECT_EQ(ToBf16(1.00390625f), 0x3f80);  // halfway 1 + 2^-8: to even (1.0)
  EXPECT_EQ(ToBf16(1.01171875f), 0x3f82);  // halfway 1 + 3·2^-8: to even (1 + 2^-6)
  EXPECT_EQ(ToBf16(1.0f + 1.0f / 128 + 1.0f / 1024), 0x3f81);
  for (int64_t m : {1, 2, 3, 5, 8, 13}) {
    for (int64_t k : {48, 100}) {
      const int64_t n = 75;
      std::mt19937 rng(static_cast<uint32_t>(m * 1000 + k));
      auto x = Random(static_cast<size_t>(m * k), rng);
      auto w = Random(static_cast<size_t>(n * k), rng);
      auto bias = Random(static_cast<size_t>(n), rng);
      std::vector<uint16_t> w16(w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        w16[i] = ToBf16(w[i]);
        const uint32_t bits = static_cast<uint32_t>(w16[i]) << 16;
        std::memcpy(&w[i], &bits, sizeof(float));
      }
      std::vector<float> y32(static_cast<size_t>(m * n)), y16(y32.size());
      LinearCpu(x.data(), w.data(), bias.data(), y32.data(), m, n, k);
      LinearBf16Cpu(x.data(), w16.data(), bias.data(), y16.data(), m, n, k);
      for (size_t i = 0; i < y32.size(); ++i) {
        ASSERT_EQ(y16[i], y32[i]) << "m=" << m << " k=" << k << " at " << i;
      }
    }
  }
}

}  // namespace
}  // namespace sluice::kernels
